"""Tests of estimators/sfs/: SFS's exactness on the twin and its TTFT distribution."""
