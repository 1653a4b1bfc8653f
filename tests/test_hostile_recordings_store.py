"""Recordings read back from the store: the Parquet tables of an
imported recording can be edited after import, so the tables are checked
against each other when a trace with steps is read (traces.checks.consistency):
`estimate` and `validate` refuse (exit 2, file, row, column) what used to
corrupt the heap inside the kernels or end in an internal error. Also the
stored cells no single table check caught: hash ids outside [0, 2**62), a
cache hit above the prompt, an accuracy above 1, and meta.json keys of the
wrong type.
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
from tests.conftest import run_cli
from tests.test_adversarial_inputs import import_args, small_recording, write_csv


@pytest.fixture(scope="module")
def stored(tmp_path_factory) -> Path:
    """The small d1 recording, imported once."""
    tmp = tmp_path_factory.mktemp("hostile-store")
    rec = small_recording(tmp)
    assert run_cli("trace", "import", "vllm-record", rec, "--out", tmp / "trace").exit_code == 0
    return tmp / "trace"


def edit(table: str, fn: Callable[[dict], None]) -> Callable[[Path], None]:
    """Rewrite ``table``.parquet after ``fn`` changed its columns (a dict of lists)."""
    def apply(t: Path) -> None:
        tab = pq.read_table(t / f"{table}.parquet")
        cols = {n: tab.column(n).to_pylist() for n in tab.column_names}
        fn(cols)
        pq.write_table(pa.table(cols), t / f"{table}.parquet")
    return apply


def setv(col: str, row: int, value) -> Callable[[dict], None]:
    def fn(cols: dict) -> None:
        cols[col][row] = value(cols) if callable(value) else value
    return fn


def _first_start(t: Path, rid: int) -> float:
    items = pq.read_table(t / "step_items.parquet").to_pandas()
    steps = pq.read_table(t / "steps.parquet").to_pandas()
    step = int(items.loc[items["request_id"] == rid, "step"].min())
    return float(steps.loc[steps["step"] == step, "start_s"].iloc[0])


def _late_arrival(t: Path) -> None:
    """The last request arrives after its first step started (TTFT kept)."""
    req = pq.read_table(t / "requests.parquet").to_pandas()
    i = len(req) - 1
    first = req["arrival_s"].iloc[i] + req["ttft_s"].iloc[i]
    start = _first_start(t, int(req["request_id"].iloc[i]))
    arrival = start + 0.5 * (first - start)
    req.loc[i, "ttft_s"] = first - arrival
    req.loc[i, "arrival_s"] = arrival
    pq.write_table(pa.Table.from_pandas(req, preserve_index=False), t / "requests.parquet")


def _add_column(table: str, name: str, values: Callable[[dict], list], typ: pa.DataType) -> Callable[[Path], None]:
    def apply(t: Path) -> None:
        tab = pq.read_table(t / f"{table}.parquet")
        cols = {n: tab.column(n).to_pylist() for n in tab.column_names}
        pq.write_table(tab.append_column(name, pa.array(values(cols), type=typ)), t / f"{table}.parquet")
    return apply


def c_last(cols: dict) -> int:
    """A request of the small recording that step 0 does not schedule (the last one)."""
    return 5


def _duplicate_item(cols: dict) -> None:
    for c in cols:
        cols[c].insert(5, cols[c][5])


def _meta(change: dict) -> Callable[[Path], None]:
    def apply(t: Path) -> None:
        meta = json.loads((t / "meta.json").read_text())
        meta.update(change)
        (t / "meta.json").write_text(json.dumps(meta))
    return apply


R, S, IT, N = "requests.parquet", "steps.parquet", "step_items.parquet", "instances.parquet"
ESTIMATE = {
    "nan_arrival": (edit("requests", setv("arrival_s", 3, float("nan"))), [R, ":4:", "arrival_s"]),
    "late_arrival": (_late_arrival, [R, "arrival_s", IT]),
    "output_below_steps": (edit("requests", setv("output_tokens", 0, 1)), [R, ":1:", "output_tokens", IT]),
    "prompt_not_steps": (edit("requests", setv("prompt_tokens", 2, lambda c: c["prompt_tokens"][2] + 3)),
                         [R, ":3:", "prompt_tokens", IT]),
    "finish_before_arrival": (edit("requests", setv("finish_s", 2, 0.0)), [R, ":3:", "finish_s", "arrival_s"]),
    "max_model_len_below_steps": (edit("instances", setv("max_model_len", 0, 64)), [N, ":1:", "max_model_len", IT]),
    "kv_blocks_below_steps": (edit("instances", setv("num_kv_blocks", 0, 1)), [N, ":1:", "num_kv_blocks", IT]),
    "max_seqs_below_steps": (edit("instances", setv("max_num_seqs", 0, 1)), [N, ":1:", "max_num_seqs", S]),
    "instance_renamed": (edit("instances", setv("instance_id", 0, "other")), [S, ":1:", "instance_id", N]),
    "steps_instance_renamed": (edit("steps", setv("instance_id", 4, "other")), [S, ":5:", "instance_id", N]),
    "item_duplicated": (edit("step_items", _duplicate_item), [IT, ":7:", "request_id", "twice"]),
    "item_unknown_request": (edit("step_items", setv("request_id", 2, 10**6)), [IT, ":3:", "request_id", R]),
    "item_unknown_step": (edit("step_items", setv("step", 2, 10**6)), [IT, ":3:", "step", S]),
    "aggregate_edited": (edit("steps", setv("decode_tokens", 9, lambda c: c["decode_tokens"][9] + 5)),
                         [S, ":10:", "decode_tokens", IT]),
    "num_preempted_edited": (edit("steps", setv("num_preempted", 9, 2)), [S, ":10:", "num_preempted"]),
    "cached_above_prompt": (_add_column("requests", "cached_tokens", lambda c: [p + 1 for p in c["prompt_tokens"]],
                                        pa.int64()), [R, ":1:", "cached_tokens"]),
    "hash_id_negative": (_add_column("requests", "hash_ids", lambda c: [[-5]] + [[]] * (len(c["request_id"]) - 1),
                                     pa.list_(pa.int64())), [R, ":1:", "hash_ids"]),
    "hash_id_2_62": (_add_column("requests", "hash_ids", lambda c: [[]] + [[1 << 62]] * (len(c["request_id"]) - 1),
                                 pa.list_(pa.int64())), [R, ":2:", "hash_ids"]),
    "scheduled_without_instance": (edit("requests", setv("instance_id", 1, None)), [R, ":2:", "instance_id", IT]),
    "preempted_before_running": (edit("preemptions", lambda c: c.update(instance_id=["tiny-a"], step=[0],
                                                                      request_id=[c_last(c)])),
                                 ["preemptions.parquet", ":1:", "request_id"]),
    "max_seqs_above_budget": (edit("instances", setv("max_num_seqs", 0, 1024)), [N, ":1:", "max_num_seqs"]),
    "meta_hash_block_text": (_meta({"hash_block_tokens": "128"}), ["meta.json", "hash_block_tokens"]),
}


@pytest.mark.parametrize("case", sorted(ESTIMATE))
def test_edited_recording_refused_by_estimate(stored, tmp_path, case):
    t = tmp_path / "t"
    shutil.copytree(stored, t)
    corrupt, fragments = ESTIMATE[case]
    corrupt(t)
    refused_cleanly(["estimate", t, "--calibrate-on", t, "--estimators", "sfs", "--out", tmp_path / "est"],
                    [tmp_path], *fragments)


def test_edited_recording_refused_by_validate(stored, tmp_path):
    """validate replays the recording on the twin: a NaN arrival of a
    scheduled request is refused before the replay."""
    t = tmp_path / "t"
    shutil.copytree(stored, t)
    edit("requests", setv("arrival_s", 3, float("nan")))(t)
    refused_cleanly(["validate", t, "--calibrate", "--out", tmp_path / "val"], [tmp_path], R, ":4:", "arrival_s")


@pytest.mark.parametrize("change, column", [({"source": "vllm-record"}, "source"), ({"tables": [1, 2]}, "tables"),
                                            ({"source": {"kind": 3}}, "source.kind"), ({"arrivals": 1}, "arrivals")])
def test_meta_json_types_refused_by_info(stored, tmp_path, change, column):
    t = tmp_path / "t"
    shutil.copytree(stored, t)
    _meta(change)(t)
    refused_cleanly(["trace", "info", t], [tmp_path], "meta.json", column)


def test_quality_accuracy_above_one_refused(tmp_path):
    """An acc of 1e300 gave OnTimeUtility 3e297: accuracies lie in [0, 1]."""
    src = write_csv(tmp_path, "azure")
    assert run_cli(*import_args("azure", src, tmp_path)).exit_code == 0
    t = tmp_path / "out"
    n = pq.read_table(t / "requests.parquet").num_rows
    ids = np.repeat(np.arange(n), 3)
    models = ["qwen3-0.6b", "qwen3-8b", "qwen3-32b"] * n
    acc = np.full(3 * n, 0.5)
    acc[4] = 1e300
    pq.write_table(pa.table({"request_id": ids, "model": models, "acc": acc, "acc_hat": np.full(3 * n, 0.5)}),
                   t / "quality.parquet")
    refused_cleanly(["replay", "--trace", t, "--pool", "qwen3-h100", "--router", "round-robin",
                     "--out", tmp_path / "res"], [tmp_path], "quality.parquet", ":5:", "acc")


@pytest.mark.parametrize("kind", ["fifo", "directory", "dev-zero"])
def test_table_that_is_no_file_refused_by_info(stored, tmp_path, kind):
    """A requests.parquet that is a FIFO, a directory or a link to a device
    was read as absent (the trace summarised without it)."""
    import os

    t = tmp_path / "t"
    shutil.copytree(stored, t)
    p = t / "requests.parquet"
    p.unlink()
    {"fifo": lambda: os.mkfifo(p), "directory": p.mkdir, "dev-zero": lambda: p.symlink_to("/dev/zero")}[kind]()
    refused_cleanly(["trace", "info", t], [tmp_path], "requests.parquet")


@pytest.mark.parametrize("where", ["head", "middle"])
def test_corrupt_parquet_bytes_refused_by_info(stored, tmp_path, where):
    t = tmp_path / "t"
    shutil.copytree(stored, t)
    p = t / "requests.parquet"  # trace info reads its cells
    data = p.read_bytes()
    at = 0 if where == "head" else 4
    p.write_bytes(data[:at] + b"\0" * 512 + data[at + 512:] if where == "middle" else b"X" + data)
    refused_cleanly(["trace", "info", t], [tmp_path], "requests.parquet")


def test_burstgpt_without_usable_rows_refused(tmp_path):
    """Only failed rows (Response tokens 0): the trace every reader refuses was written, exit 0."""
    from tests.test_adversarial_inputs import BURST_HEAD

    src = write_csv(tmp_path, "burstgpt", rows=[f"{i},ChatGPT,10,0,10,Conversation log" for i in range(3)])
    assert BURST_HEAD.startswith("Timestamp")
    refused_cleanly(import_args("burstgpt", src, tmp_path), [tmp_path], "burst.csv", "file")
