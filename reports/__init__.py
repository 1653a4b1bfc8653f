"""latroute: reports."""
