"""Judging estimates against what came true.

- ``accuracy``: the error metrics shared by batch-time and TTFT evaluation;
- ``conformal``: online recalibration of a TTFT distribution's quantiles from
  the measured TTFTs that have already come back (conformal quantiles; not
  the host rescale of ``estimators.timemodel.rescale``).

May import ``traces`` and third-party numerics only: every estimator family
is scored with these, so they import none of them.
"""
