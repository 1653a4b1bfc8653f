"""Tests of estimators/evaluate/: online recalibration of SFS's quantiles."""
