"""The batch-time model: how long one engine step takes on one host.

A profile is fitted once on recorded steps and then corrected for the host
it runs on; everything about a step's time lives here, so the fit, its noise
and the host-speed corrections change together.

- ``features``: the design matrices of the model forms; ``fit``: Huber
  regression, stall detection and the noise model; ``intake``: the cost of
  a request joining at a step boundary; ``step_correlation``: how much of a
  trajectory's noise its steps share;
- ``profile``: ``BatchTimeProfile``, the fitted model as a versioned JSON
  document; ``builtin_profiles``: the built-in pool's profiles;
  ``kernel_form``: a profile as the engine's kernels take it (``TimeModel``);
- ``calibrate``: fitting a profile from recorded (or simulated) steps;
  ``rescale``: a profile moved to a new host by a speed factor
  (``calibrate --update``);
- host speed: ``step_ratios`` (actual / typical per step), ``drift`` (a
  trace's speed against a profile) and ``online_speed`` (the running factor
  learned from completed steps, the one rule the twin's loop also follows);
- ``synthetic_steps``: steps with known ground truth, for checking the fit.

May import ``traces``, ``estimators.engine``, ``estimators.evaluate`` (error
metrics) and ``estimators.baselines`` (their parameters are measured on the
same calibration traces); never the SFS estimator, the learned family,
routers or the harness.
"""
