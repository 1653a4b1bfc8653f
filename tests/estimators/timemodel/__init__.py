"""Tests of estimators/timemodel/: the batch-time model, calibration, drift and noise fits."""
