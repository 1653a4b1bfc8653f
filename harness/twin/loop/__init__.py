"""The twin's compiled inner loop: one instance's steps advanced in Numba.

- ``kernel``: the loop (steps up to a time, each event the engine loop's
  ``estimators.engine.step_loop.loop_step``, true durations drawn from the
  profile and its noise), with vLLM's async scheduling (a two-deep batch
  queue) a mode of it;
- ``parts``: the bundles and the online speed rule (the field layouts are
  the engine loop's);
- ``skip``: exact skipping of runs of identical decode steps;
  ``run_memo``: the steps ahead of a steady run, drawn once;
- ``borrow``: an item of a Numba typed list for kernels without Numba's runtime;
  ``hand_over``: a request handed to an instance, an idle engine woken.

May import ``estimators`` only; never the views,
pools, routers, the Python-side ``Instance`` or the simulation around it.
"""
