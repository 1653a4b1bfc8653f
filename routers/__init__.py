"""latroute: routers."""
