"""Tests of estimators/learned/: the learned estimator and its compiled forest."""
