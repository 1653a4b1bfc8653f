"""The engine model: one vLLM-like instance, once.

The bottom layer: it imports nothing of latroute but itself (the
``[tool.importlinter]`` contracts in pyproject.toml; ``lint-imports``).
Traces, fitted profiles and the twin are converted to its plain arrays
above it (``estimators.timemodel.kernel_form``, ``estimators.trace_blocks``).

- ``config``: ``InstanceConfig``, the one engine configuration (defaults,
  validation, ``instances`` rows, pool entries, the kernel's ``cfg`` array);
- ``state``: the state layout as named bundles of arrays (``SchedState``,
  ``StepPlan``) and their Python-side helpers;
- ``primitives``: the waiting-queue, admission and preemption moves, in
  Numba, written once and used by every kernel; ``kv_blocks``: the KV-block
  moves they make (a free count, or the block pool);
- ``kernel``: the scheduler (one step's decisions and its outputs), written
  in ``sched_moves``' per-request moves;
- ``step_loop``: one event of an instance's loop (a step's outputs, or the
  next schedule() and the step's duration), the one caller of the
  kernel's step API, for the twin and SFS alike, and the loop's layouts;
- ``timing``: the batch-time model in Numba (typical time and noise);
- ``recorded``: advancing a state by a batch someone else chose;
- ``view``: ``InstanceView``, what an estimator may read of an instance;
- ``block_pool``, ``block_ids``, ``block_overlay``: vLLM's block pool with
  its prefix cache, the blocks' hash ids, and SFS's overlay over a live pool;
- ``fastcall``: calling a compiled kernel without Numba's per-call typing.
"""
