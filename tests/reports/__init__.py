"""Tests of reports/: reports, serving metrics, the regression gate's output, colours and wording."""
