"""Tests of estimators/: the TTFT estimators, the estimate command, plug-in estimators."""
