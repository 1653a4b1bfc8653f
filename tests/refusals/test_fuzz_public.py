"""Fuzzing the public trace formats: small slices of the shared
Azure, Mooncake, LMBench and vLLM-bench files (and a BurstGPT-shaped CSV:
the shared data has none), one random corruption each, imported with
``trace import FORMAT``; what is accepted is then replayed (``replay
--trace``) and, for the request-level formats (vllm-bench JSON, LMBench
CSV), validated on the twin (``validate``), in the campaign.

The promise (tests/support/fuzz_corruptors.broken_promise): accepted with a valid trace, or
refused with exit 2 and one ``error:`` line naming the corrupted file; never
a traceback, an internal error, a hang, a changed input or a half output."""
from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.conftest import shared
from tests.support.clean_refusal import tree_state
from tests.support.fuzz_corruptors import (
    QUICK,
    Campaign,
    Worker,
    broken_promise,
    campaign_seconds,
    corrupt,
    in_process,
    kinds_for,
    long_settings,
)
from traces.store import open_trace

ROWS = 120


def _head(path: Path, n: int) -> bytes:
    with open(path, "rb") as f:
        return b"".join(f.readline() for _ in range(n))


def _burstgpt() -> bytes:
    lines = ["Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type"]
    for i in range(ROWS):
        req, resp = 100 + (i * 37) % 900, (i * 13) % 300
        lines.append(f"{i * 3},{'ChatGPT' if i % 3 else 'GPT-4'},{req},{resp},{req + resp},Conversation log")
    return ("\n".join(lines) + "\n").encode()


def _bench() -> bytes:
    src = sorted(shared("vllm_bench_serving_a100_per_request", "runs").glob("*qps_04*.json"))[0]
    doc = json.loads(src.read_text())
    n = 40
    for k in ("input_lens", "output_lens", "ttfts", "itls", "errors", "generated_texts"):
        if isinstance(doc.get(k), list):
            doc[k] = doc[k][:n]
    doc["num_prompts"] = doc["completed"] = n
    return json.dumps(doc, indent=1).encode()


def sources(root: Path) -> dict[str, tuple[list[Path], list]]:
    """format: (its files, written under root, the first being SRC; extra arguments)."""
    out: dict[str, tuple[list[Path], list]] = {}

    def put(fmt: str, name: str, raw: bytes, extra: list | None = None, more: dict[str, bytes] | None = None):
        d = root / fmt
        d.mkdir(parents=True, exist_ok=True)
        (d / name).write_bytes(raw)
        files = [d / name]
        for k, v in (more or {}).items():
            (d / k).write_bytes(v)
            files.append(d / k)
        out[fmt] = (files, extra or [])

    put("azure", "AzureLLMInferenceTrace_conv.csv", _head(shared("azure_llm_2023", "AzureLLMInferenceTrace_conv.csv"), ROWS))
    put("burstgpt", "BurstGPT_1.csv", _burstgpt())
    put("mooncake", "conversation_trace.jsonl", _head(shared("mooncake", "conversation_trace.jsonl"), ROWS // 2))
    lmb = shared("llmd_lmbench_per_request")
    put("lmbench", "per_request.csv", _head(lmb / "per_request.csv", ROWS),
        ["--run", "r000", "--accept-unmodelled", "lmcache", "--allow-incomplete"],
        {"runs.csv": _head(lmb / "runs.csv", 3)})
    put("vllm-bench", "bench.json", _bench())
    return out


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("public")
    sources(root)
    return root


FORMATS = ["azure", "burstgpt", "mooncake", "lmbench", "vllm-bench"]


def valid_trace(out: Path) -> None:
    assert len(open_trace(out).read("requests")) > 0


REQUEST_LEVEL = {"vllm-bench", "lmbench"}  # measured TTFTs, no steps: validate replays them on the twin


def downstream(fmt: str, tr: Path, root: Path) -> dict[str, list]:
    """What reads an accepted import: replay of its requests; for a request-level trace, validate too."""
    cmds = {"replay": ["replay", "--trace", tr, "--requests", "40", "--out", root / "rep"]}
    if fmt in REQUEST_LEVEL:
        cmds["validate"] = ["validate", tr, "--profile", "qwen3-8b-h100", "--out", root / "val"]
    return cmds


def one_case(data, pristine: Path, run, fmts: list[str] = FORMATS, then: bool = False) -> list[tuple[str, str | None]]:
    """One corrupted source imported (and, with ``then``, what reads the import)."""
    fmt = data.draw(st.sampled_from(fmts), label="format")
    root = Path(tempfile.mkdtemp(prefix="fz-pub-"))
    try:
        shutil.copytree(pristine / fmt, root / fmt)
        files, extra = sources_index(root)[fmt]
        target = data.draw(st.sampled_from(files), label="file")
        how, new = corrupt(data, target.read_bytes(), kinds_for(target))
        target.write_bytes(new)
        before = tree_state(root / fmt)
        out = root / "out"
        o = run(["trace", "import", fmt, files[0], "--out", out, *extra])
        what = f"trace import {fmt}: {target.name}: {how}"
        results = [(what, broken_promise(o, [f.name for f in files], before, [root / fmt], out, valid_trace))]
        if then and o.code == 0 and results[0][1] is None:
            names = [out.name, target.name, *(p.name for p in out.iterdir())]
            for cmd, args in downstream(fmt, out, root).items():
                snap = tree_state(out)
                res = Path(args[args.index("--out") + 1])
                results.append((f"{cmd} on {what}", broken_promise(run(args), names, snap, [out], res)))
        return results
    finally:
        shutil.rmtree(root, ignore_errors=True)


def sources_index(root: Path) -> dict[str, tuple[list[Path], list]]:
    """The files of each format as laid out by ``sources`` (without writing)."""
    names = {"azure": ["AzureLLMInferenceTrace_conv.csv"], "burstgpt": ["BurstGPT_1.csv"],
             "mooncake": ["conversation_trace.jsonl"], "lmbench": ["per_request.csv", "runs.csv"],
             "vllm-bench": ["bench.json"]}
    extra = {"lmbench": ["--run", "r000", "--accept-unmodelled", "lmcache", "--allow-incomplete"]}  # a slice of r000
    return {f: ([root / f / n for n in ns], extra.get(f, [])) for f, ns in names.items()}


def test_the_pristine_slices_import(pristine, tmp_path):
    """The fuzzers' base files are valid: any refusal is the corruption's."""
    for fmt in FORMATS:
        files, extra = sources_index(pristine)[fmt]
        o = in_process(["trace", "import", fmt, files[0], "--out", tmp_path / fmt, *extra])
        assert o.code == 0, (fmt, o.stderr)


@QUICK
@given(data=st.data())
def test_a_corrupted_public_trace_keeps_the_promise(pristine, data):
    [(what, problem)] = one_case(data, pristine, in_process)
    assert problem is None, f"{what} → {problem}"


@pytest.mark.fuzz
def test_public_formats_campaign(pristine):
    camp = Campaign("public formats→trace import", campaign_seconds(0.06))
    worker = Worker()

    @long_settings(100_000)
    @given(data=st.data())
    def one(data):
        camp.tick()
        for what, problem in one_case(data, pristine, lambda a: worker.run_confirmed(a, 90), then=True):
            camp.judge(what, problem)

    camp.run(one, worker)
    camp.finish()
