"""The recording scheduler under a vLLM release, without a model.

Run in that release's interpreter (standard library and vLLM only):
``PYTHON tests/traces/vllm_recorder/record_without_model.py OUT NAME...``.
The peer generator (``tests/peer/generate_fixtures.py``) builds the
release's own ``Scheduler`` over a mock KV cache and drives it with
fabricated model outputs; here it builds ``RecordingScheduler`` instead, so
each scenario NAME is recorded into ``OUT/NAME`` by the recorder while the
generator keeps its own record of every step (``OUT/NAME.peer.json``), and
the state feed's frame right after every ``schedule()`` is kept too
(``OUT/NAME.frames``, length-prefixed as on the wire). The test compares
them: the recorder and the feed must see exactly what the scheduler did. Why: a release whose compiled kernels do not load here
cannot run a model, but its scheduler is pure Python, and the recorder is
a wrapper around that scheduler only; this is what can be checked of it.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def main(out: str, names: list[str]) -> int:
    sys.path[:0] = [str(ROOT / "tests" / "peer"), str(ROOT)]
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    import generate_fixtures as gen
    from scenarios import scenarios

    from traces.vllm_recorder import scheduler as rec
    from traces.vllm_recorder.ids import client_id_of
    from traces.vllm_recorder.state_feed import frame

    by_name = {sc["name"]: sc for sc in scenarios()}
    build, made, frames = gen.build_scheduler, [], []

    def recording(eng: dict, model_dir: str, async_scheduling: bool = False):
        s = build(eng, model_dir, async_scheduling, cls=rec.RecordingScheduler)
        schedule = s.schedule

        def schedule_and_frame(*a, **k):  # the feed's frame of the step just planned
            out = schedule(*a, **k)
            items = [[rid, n, s.requests[rid].num_computed_tokens - n] for rid, n in out.num_scheduled_tokens.items()]
            frames.append(frame(s, len(frames), (0.0, items) if items else None, client_id_of))
            return out

        s.schedule = schedule_and_frame
        made.append(s)
        return s

    gen.build_scheduler = recording  # run_vllm builds its scheduler through this name
    for name in names:
        os.environ[rec.ENV_DIR] = str(Path(out) / name)
        frames.clear()
        result = gen.run_vllm(by_name[name], gen.DEFAULT_MODEL)
        made[-1].shutdown()  # closes the recording: parts joined, recorder.json written
        (Path(out) / f"{name}.peer.json").write_text(json.dumps(result))
        (Path(out) / f"{name}.frames").write_bytes(b"".join(frames))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2:]))
