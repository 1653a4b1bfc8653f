"""Validation of what latroute reads back: traces on disk (the
Parquet tables, meta.json, instances and quality tables), pool files and the
step aggregates. Every case is a clean refusal (tests/adversarial.py): exit 2,
one ``error:`` line naming file, row and column, nothing written (split from
test_adversarial_inputs.py, which keeps the importers' source files).
"""
from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.adversarial import refused_cleanly
from tests.conftest import run_cli, shared
from tests.test_adversarial_inputs import BIG, import_args, small_recording, write_csv
from traces.datamodel.limits import MAX_TOKENS


# ------------------------------------------------------ traces on disk
@pytest.fixture
def trace_dir(tmp_path) -> Path:
    """A valid three-request trace from the azure CSV."""
    src = write_csv(tmp_path, "azure")
    assert run_cli(*import_args("azure", src, tmp_path)).exit_code == 0
    return tmp_path / "out"


def _requests_table(t: Path) -> pa.Table:
    return pq.read_table(t / "requests.parquet")


def _replace_column(name: str, array: Callable[[int], pa.Array]):
    def apply(t: Path) -> None:
        table = _requests_table(t)
        i = table.column_names.index(name)
        pq.write_table(table.set_column(i, name, array(table.num_rows)), t / "requests.parquet")
    return apply


def _other_table(t: Path) -> None:
    pq.write_table(pa.table({"instance_id": ["a"], "step": [0], "start_s": [0.0]}), t / "requests.parquet")


def _zero_rows(t: Path) -> None:
    pq.write_table(_requests_table(t).slice(0, 0), t / "requests.parquet")


def _meta(text: str):
    return lambda t: (t / "meta.json").write_text(text)


def _nan_arrivals(t: Path) -> None:
    table = _requests_table(t)
    i = table.column_names.index("arrival_s")
    pq.write_table(table.set_column(i, "arrival_s", pa.array([None] * table.num_rows, pa.float64())),
                   t / "requests.parquet")
    meta = json.loads((t / "meta.json").read_text())
    meta["arrivals"] = "unknown"
    (t / "meta.json").write_text(json.dumps(meta))


def _dup_column(t: Path) -> None:
    table = _requests_table(t)
    pq.write_table(table.append_column("prompt_tokens", table.column("prompt_tokens")), t / "requests.parquet")


TRACE_CASES = [
    ("string-typed-count", _replace_column("prompt_tokens", lambda n: pa.array(["12"] * n)),
     ["requests.parquet", "prompt_tokens", "string"]),
    ("uint64-2^63", _replace_column("prompt_tokens", lambda n: pa.array([BIG] * n, pa.uint64())),
     ["requests.parquet:1", "prompt_tokens", "maximum"]),
    ("int64-max-tokens", _replace_column("output_tokens", lambda n: pa.array([BIG - 1] * n, pa.int64())),
     ["requests.parquet:1", "output_tokens", "maximum"]),
    ("float-above-2^53", _replace_column("request_id", lambda n: pa.array([2.0**60 + i * 2**10 for i in range(n)])),
     ["requests.parquet:1", "request_id", "2**53"]),
    ("fractional-tokens", _replace_column("prompt_tokens", lambda n: pa.array([1.5] * n)),
     ["requests.parquet:1", "prompt_tokens", "whole"]),
    ("dup-request-id", _replace_column("request_id", lambda n: pa.array([7] * n, pa.int64())),
     ["requests.parquet:2", "request_id", "duplicate"]),
    ("arrival-1e300", _replace_column("arrival_s", lambda n: pa.array([0.0] * (n - 1) + [1e300])),
     ["requests.parquet:3", "arrival_s", "maximum"]),
    ("arrival-string", _replace_column("arrival_s", lambda n: pa.array(["0"] * n)),
     ["requests.parquet", "arrival_s", "string"]),
    ("other-table", _other_table, ["requests.parquet", "missing column"]),
    ("dup-column", _dup_column, ["requests.parquet", "prompt_tokens", "duplicate"]),
    ("zero-rows", _zero_rows, ["requests", "no requests"]),
    ("unknown-arrivals", _nan_arrivals, ["requests.parquet:1", "arrival_s", "unknown"]),
    ("meta-list", _meta("[1, 2]"), ["meta.json", "not a JSON object"]),
    ("meta-null", _meta("null"), ["meta.json", "not a JSON object"]),
    ("meta-string", _meta('"trace"'), ["meta.json", "not a JSON object"]),
    ("meta-NaN", _meta('{"schema_version": NaN}'), ["meta.json", "NaN"]),
    ("meta-deep", _meta("[" * 5000 + "]" * 5000), ["meta.json", "nested"]),
    ("meta-not-utf8", lambda t: (t / "meta.json").write_bytes(b'{"a": "\xff"}'), ["meta.json", "UTF-8"]),
]


GENERATE_CASES = [(use, *c) for use in ("lengths-from", "arrivals-from") for c in TRACE_CASES
                  if not (use == "lengths-from" and c[0] == "unknown-arrivals")]  # lengths need no arrivals


@pytest.mark.parametrize("use,corrupt,fragments", [(c[0], *c[2:]) for c in GENERATE_CASES],
                         ids=[f"{c[0]}-{c[1]}" for c in GENERATE_CASES])
def test_generate_from_a_bad_trace_refuses(tmp_path, trace_dir, corrupt, fragments, use):
    corrupt(trace_dir)
    refused_cleanly(["trace", "generate", "--out", tmp_path / "gen", "--requests", "3", "--rate", "1",
                     f"--{use}", trace_dir], [tmp_path], *fragments)


@pytest.mark.parametrize("corrupt,fragments", [c[1:] for c in TRACE_CASES if c[0].startswith(("meta", "other",
                                                                                              "string", "dup-col"))],
                         ids=[c[0] for c in TRACE_CASES if c[0].startswith(("meta", "other", "string", "dup-col"))])
def test_trace_info_refuses(trace_dir, corrupt, fragments):
    corrupt(trace_dir)
    refused_cleanly(["trace", "info", trace_dir], [trace_dir], *fragments)


def _instances(t: Path, **kw) -> None:
    table = pq.read_table(t / "instances.parquet")
    for name, value in kw.items():
        i = table.column_names.index(name)
        table = table.set_column(i, name, pa.array([value] * table.num_rows, table.schema.field(name).type))
    pq.write_table(table, t / "instances.parquet")


INSTANCE_CASES = [
    ("kv-blocks-0", {"num_kv_blocks": 0}, ["instances.parquet:1", "num_kv_blocks", "positive"]),
    ("kv-blocks-2^62", {"num_kv_blocks": 2**62}, ["instances.parquet:1", "num_kv_blocks", "maximum"]),
    ("unknown-policy", {"policy": "fifo"}, ["instances.parquet:1", "policy", "fifo"]),
    ("block-size-negative", {"block_size": -16}, ["instances.parquet:1", "block_size"]),
]


@pytest.mark.parametrize("kw,fragments", [c[1:] for c in INSTANCE_CASES], ids=[c[0] for c in INSTANCE_CASES])
def test_instances_table_refused(tmp_path, kw, fragments):
    rec = small_recording(tmp_path)
    assert run_cli(*import_args("vllm-record", rec, tmp_path)).exit_code == 0
    _instances(tmp_path / "out", **kw)
    refused_cleanly(["validate", tmp_path / "out", "--calibrate", "--out", tmp_path / "val"], [tmp_path], *fragments)


def test_partial_quality_table_refused(tmp_path):
    """Some (request, model) pairs missing: refused, never read as accuracy 0."""
    assert run_cli("trace", "generate", "--out", tmp_path / "g", "--requests", "6", "--rate", "5").exit_code == 0
    q = pq.read_table(tmp_path / "g" / "quality.parquet")
    pq.write_table(q.slice(0, q.num_rows - 1), tmp_path / "g" / "quality.parquet")
    refused_cleanly(["replay", "--trace", tmp_path / "g", "--router", "shortest-queue", "--out", tmp_path / "r"],
                    [tmp_path], "quality", "partial")


# ------------------------------------------------------------- pool files
POOL = {"name": "p", "instances": [{"instance_id": "a", "model": "qwen3-8b", "profile": "qwen3-8b-h100"}]}


def _pool(**inst) -> dict:
    return {**POOL, "instances": [{**POOL["instances"][0], **inst}]}


POOL_CASES = [
    ("kv-blocks-2^63", _pool(num_kv_blocks=BIG), ["pool.json:1", "num_kv_blocks"]),
    ("kv-blocks-0", _pool(num_kv_blocks=0), ["pool.json:1", "num_kv_blocks"]),
    ("unknown-policy", _pool(policy="fifo"), ["pool.json:1", "policy"]),
    ("seqs-float", _pool(max_num_seqs=2.5), ["pool.json:1", "max_num_seqs"]),
    ("price-negative", _pool(price_in=-1), ["pool.json:1", "price_in"]),
    ("watermark-string", _pool(watermark="x"), ["pool.json:1", "watermark"]),
    ("host-speed-bool", _pool(host_speed=True), ["pool.json:1", "host_speed"]),
    ("gpus-2^63", _pool(gpus=BIG), ["pool.json:1", "gpus"]),
    ("overhead-huge", {**POOL, "frontend_overhead_s": 1e300}, ["pool.json", "frontend_overhead_s"]),
    ("overhead-string", {**POOL, "frontend_overhead_s": "x"}, ["pool.json", "frontend_overhead_s"]),
    ("dup-instance", {**POOL, "instances": POOL["instances"] * 2}, ["pool.json:2", "instance_id", "duplicate"]),
    ("NaN", '{"name": NaN}', ["pool.json", "NaN"]),
    ("a-list", "[]", ["pool.json", "instances"]),
    ("null", "null", ["pool.json", "instances"]),
]


@pytest.mark.parametrize("doc,fragments", [c[1:] for c in POOL_CASES], ids=[c[0] for c in POOL_CASES])
def test_pool_files_refused(tmp_path, doc, fragments):
    p = tmp_path / "pool.json"
    p.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    refused_cleanly(["replay", "--pool", p, "--rate", "1", "--requests", "5", "--out", tmp_path / "r"], [tmp_path],
                    *fragments)


# ---------------------------------------------- aggregates cannot wrap
def test_step_aggregates_refuse_overflow():
    import pandas as pd

    from traces.datamodel.step_aggregates import step_aggregates

    items = pd.DataFrame({"instance_id": "a", "step": [0, 0], "request_id": [0, 1], "tokens": [2**31, 2**31],
                          "computed_before": [0, 0], "prompt_tokens": [2**31, 2**31]})
    with pytest.raises(OverflowError):
        step_aggregates(items)
    ok = step_aggregates(items.assign(tokens=[MAX_TOKENS, MAX_TOKENS], prompt_tokens=[MAX_TOKENS, MAX_TOKENS]))
    assert int(ok["sum_prefill_sq"].iloc[0]) == 2 * MAX_TOKENS**2  # exact, not wrapped


# -------------------------------------- the real recordings still import
def test_every_real_recording_imports(tmp_path):
    import gzip

    root = shared("vllm_cpu")
    sources = sorted(p for p in root.iterdir() if p.is_dir())
    committed = Path(__file__).parent / "data" / "recordings"
    for name in ("server_tinya_poisson_r2_nopc", "server_tinya_d8sessions_pc"):
        dst = tmp_path / "src" / name
        dst.mkdir(parents=True)
        for f in ("engine.json", "requests.csv"):
            shutil.copy(committed / name / "recording" / f, dst / f)
        with gzip.open(committed / name / "recording" / "steps.jsonl.gz", "rb") as z, \
                open(dst / "steps.jsonl", "wb") as out:
            shutil.copyfileobj(z, out)
        sources.append(dst)
    for src in sources:
        res = run_cli("trace", "import", "vllm-record", src, "--out", tmp_path / "t" / src.name)
        assert res.exit_code == 0, (src.name, res.output)
        steps = pq.read_table(tmp_path / "t" / src.name / "steps.parquet").to_pandas()
        assert (np.diff(steps["start_s"].to_numpy()) >= 0).all()


@pytest.mark.parametrize("text", ["alpaca=inf", "alpaca=nan", "alpaca=1e308,govreport=1e308", "alpaca=-1",
                                  "alpaca=0", "alpaca=x", "nosuch=1", "alpaca"])
def test_task_mix_refused(text):
    """A weight that is not a finite number would normalise to NaN weights."""
    from traces.policies.tasks import parse_mix

    with pytest.raises(ValueError):
        parse_mix(text)
