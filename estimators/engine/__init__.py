"""The engine model: one vLLM-like instance, once.

- ``config``: ``InstanceConfig``, the one engine configuration (defaults,
  validation, ``instances`` rows, pool entries, the kernel's ``cfg`` array);
- ``state``: the state layout as named bundles of arrays (``SchedState``,
  ``StepPlan``) and their Python-side helpers;
- ``primitives``: the waiting-queue, admission and preemption moves, in
  Numba, written once and used by every kernel;
- ``kernel``: the scheduler (one step's decisions and its outputs);
- ``timing``: the batch-time model in Numba (typical time and noise);
- ``recorded``: advancing a state by a batch someone else chose;
- ``view``: ``InstanceView``, what an estimator may read of an instance;
- ``steplog``: ``StepLog``, the steps / step_items / preemptions tables;
- ``fastcall``: calling a compiled kernel without Numba's per-call typing.
"""
