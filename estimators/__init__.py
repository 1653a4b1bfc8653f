"""latroute: estimators."""
