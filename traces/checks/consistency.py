"""Consistency of a recording's tables with each other.

Each table of a recording can pass its own schema (``traces.checks.frame_checks``)
and still contradict another: a request scheduled in a step that started
before it arrived, a step that schedules more tokens for a request than its
prompt and output hold, a step that holds more KV blocks or a longer
sequence than the instance's ``num_kv_blocks`` / ``max_model_len`` allow, an
item naming a request or a step that does not exist. The state rebuilder
(``estimators.snapshot.RecordedWalk``) and the kernels index their arrays by
these values, so one such contradiction corrupts memory inside compiled code
instead of being reported. ``check_recording`` refuses the first one, naming
both places (the file where it is reported, the other in the reason), and
runs where a recording enters: at ``trace import vllm-record`` (naming the
source files' lines) and when a stored trace with steps is read
(``traces.store.Trace.read``, naming the Parquet rows), since the Parquet
files can be edited after import.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from traces.checks.frame_checks import STEP_TIME_SLACK_S, first_true
from traces.datamodel.step_aggregates import AGGREGATE_COLUMNS, step_aggregates
from traces.errors import BadInput

if TYPE_CHECKING:
    import pandas as pd

DEFAULT_MAX_MODEL_LEN = 40960  # InstanceConfig's: 0 or empty max_model_len means this


@dataclass(frozen=True)
class Where:
    """How to name a table's rows: its file and each 0-based position's row
    (``None``: the file as a whole, e.g. engine.json for the instances)."""

    file: str
    row_of: Callable[[int], int | None] = lambda i: i + 1
    label: str = "row"

    def at(self, i: int) -> str:
        row = self.row_of(i)
        return self.file if row is None else f"{self.file} {self.label} {row}"


def _refuse(w: Where, i: int, column: str, reason: str) -> None:
    raise BadInput(w.file, w.row_of(i), column, reason)


def check_recording(requests: pd.DataFrame, steps: pd.DataFrame, items: pd.DataFrame,
                    preemptions: pd.DataFrame | None, instances: pd.DataFrame,
                    where: dict[str, Where]) -> None:
    """Refuse the first contradiction between the tables of a recording
    (each already valid on its own). ``where`` names the files and rows of
    requests, steps, step_items, preemptions and instances."""
    import pandas as pd

    inst_index = pd.Index(instances["instance_id"].astype(str).to_numpy())
    s_inst = steps["instance_id"].astype(str).to_numpy()
    bad = first_true(inst_index.get_indexer(s_inst) < 0)
    if bad is not None:
        _refuse(where["steps"], bad, "instance_id",
                f"instance {str(s_inst[bad])!r} has steps but no row in {where['instances'].file}")
    if "instance_id" in requests:
        r_inst = requests["instance_id"]
        known = r_inst.isna().to_numpy() | r_inst.astype(str).isin(inst_index).to_numpy()
        bad = first_true(~known)
        if bad is not None:
            _refuse(where["requests"], bad, "instance_id",
                    f"instance {str(r_inst.iloc[bad])!r} is not in {where['instances'].file}")
    step_key = pd.MultiIndex.from_arrays([s_inst, steps["step"].to_numpy(dtype=np.int64)])  # unique: check_steps
    req_pos = pd.Index(requests["request_id"].to_numpy(dtype=np.int64))  # unique: the schema
    it_inst = items["instance_id"].astype(str).to_numpy()
    it_step = items["step"].to_numpy(dtype=np.int64)
    it_rid = items["request_id"].to_numpy(dtype=np.int64)
    it_k = _positions(step_key, [it_inst, it_step])
    bad = first_true(it_k < 0)
    if bad is not None:
        _refuse(where["step_items"], bad, "step", f"step {it_step[bad]} of instance {str(it_inst[bad])!r} is not in "
                                                  f"{where['steps'].file}")
    it_r = req_pos.get_indexer(it_rid).astype(np.int64)
    bad = first_true(it_r < 0)
    if bad is not None:
        _refuse(where["step_items"], bad, "request_id", f"request {it_rid[bad]} is not in {where['requests'].file}")
    _check_duplicate_items(it_k, it_r, it_step, it_rid, where["step_items"])
    if preemptions is not None and len(preemptions):
        _check_preemptions(preemptions, step_key, req_pos, where)
        _check_preempted_ran(preemptions, it_k, it_r, step_key, req_pos, where)
    _check_aggregates(steps, items, preemptions, where)
    _check_against_requests(requests, steps, items, it_k, it_r, where)
    _check_limits(requests, steps, items, instances, inst_index.get_indexer(it_inst).astype(np.int64), it_k, it_r,
                  where)
    _check_scheduled(requests, it_r, it_inst, where)


def _check_duplicate_items(it_k: np.ndarray, it_r: np.ndarray, it_step: np.ndarray, it_rid: np.ndarray,
                           w: Where) -> None:
    if not len(it_k):
        return
    order = np.lexsort((np.arange(len(it_k)), it_r, it_k))
    same = (it_k[order][1:] == it_k[order][:-1]) & (it_r[order][1:] == it_r[order][:-1])
    bad = first_true(same)
    if bad is not None:
        i = int(order[bad + 1])
        _refuse(w, i, "request_id", f"request {it_rid[i]} is scheduled twice in step {it_step[i]}")


def _positions(index: pd.MultiIndex, arrays: list[np.ndarray]) -> np.ndarray:
    """Each (instance, step) pair's position in ``index``, -1 where absent."""
    import pandas as pd

    if not len(arrays[0]):
        return np.zeros(0, dtype=np.int64)
    return index.get_indexer(pd.MultiIndex.from_arrays(arrays)).astype(np.int64)


def _check_preemptions(pre: pd.DataFrame, step_key: pd.MultiIndex, req_pos: pd.Index,
                       where: dict[str, Where]) -> None:
    p_inst = pre["instance_id"].astype(str).to_numpy()
    p_step = pre["step"].to_numpy(dtype=np.int64)
    p_rid = pre["request_id"].to_numpy(dtype=np.int64)
    w = where["preemptions"]
    bad = first_true(_positions(step_key, [p_inst, p_step]) < 0)
    if bad is not None:
        _refuse(w, bad, "step", f"step {p_step[bad]} of instance {str(p_inst[bad])!r} is not in {where['steps'].file}")
    bad = first_true(req_pos.get_indexer(p_rid) < 0)
    if bad is not None:
        _refuse(w, bad, "request_id", f"request {p_rid[bad]} is not in {where['requests'].file}")


def _check_preempted_ran(pre: pd.DataFrame, it_k: np.ndarray, it_r: np.ndarray, step_key: pd.MultiIndex,
                         req_pos: pd.Index, where: dict[str, Where]) -> None:
    """A request is preempted only while it runs: some earlier step of its
    instance scheduled it (steps are numbered in time order per instance)."""
    import pandas as pd

    p_k = _positions(step_key, [pre["instance_id"].astype(str).to_numpy(), pre["step"].to_numpy(dtype=np.int64)])
    p_r = req_pos.get_indexer(pre["request_id"].to_numpy(dtype=np.int64))
    step_no = step_key.get_level_values(1).to_numpy()
    step_inst = step_key.get_level_values(0).to_numpy()
    first = pd.DataFrame({"r": it_r, "i": step_inst[it_k] if len(it_k) else [], "s": step_no[it_k] if len(it_k)
                          else []}).groupby(["r", "i"])["s"].min()
    keys = pd.MultiIndex.from_arrays([p_r, step_inst[p_k]])
    ran = first.reindex(keys).to_numpy(dtype=np.float64)
    bad = first_true(~(ran < step_no[p_k]))
    if bad is not None:
        _refuse(where["preemptions"], bad, "request_id",
                f"request {int(pre['request_id'].iloc[bad])} is preempted in step {int(step_no[p_k[bad]])} but no "
                f"earlier step of {where['step_items'].file} scheduled it")


def _check_aggregates(steps: pd.DataFrame, items: pd.DataFrame, pre: pd.DataFrame | None,
                      where: dict[str, Where]) -> None:
    """The steps' batch aggregates are sums over their items (and
    ``num_preempted`` the count of their preemptions): a duplicated or
    edited item shows here."""
    cols = [c for c in AGGREGATE_COLUMNS if c in steps]
    if not cols and "num_preempted" not in steps:
        return
    try:
        agg = step_aggregates(items)
    except OverflowError as e:
        raise BadInput(where["step_items"].file, None, "tokens", str(e)) from None
    key = steps[["instance_id", "step"]].astype({"instance_id": str})
    agg = agg.astype({"instance_id": str})
    merged = key.merge(agg, on=["instance_id", "step"], how="left")
    for c in cols:
        want = merged[c].fillna(0).to_numpy(dtype=np.int64)
        got = steps[c].to_numpy(dtype=np.int64)
        bad = first_true(want != got)
        if bad is not None:
            _refuse(where["steps"], bad, c, f"step {int(steps['step'].iloc[bad])} has {c} {got[bad]}, but its items "
                                            f"in {where['step_items'].file} sum to {want[bad]}")
    if "num_preempted" in steps:
        if pre is None or not len(pre):
            want = np.zeros(len(steps), dtype=np.int64)
        else:
            counts = pre.astype({"instance_id": str}).groupby(["instance_id", "step"]).size().rename("n").reset_index()
            want = key.merge(counts, on=["instance_id", "step"], how="left")["n"].fillna(0).to_numpy(dtype=np.int64)
        got = steps["num_preempted"].to_numpy(dtype=np.int64)
        bad = first_true(want != got)
        if bad is not None:
            _refuse(where["steps"], bad, "num_preempted",
                    f"step {int(steps['step'].iloc[bad])} has num_preempted {got[bad]}, but "
                    f"{where['preemptions'].file} lists {want[bad]}")


def _check_against_requests(requests: pd.DataFrame, steps: pd.DataFrame, items: pd.DataFrame,
                            it_k: np.ndarray, it_r: np.ndarray, where: dict[str, Where]) -> None:
    """Each item against its request: the same instance and prompt, no more
    tokens than prompt + output, and a step that starts after the request
    arrived (and was handed to the engine)."""
    wr, wi = where["requests"], where["step_items"]
    if not len(it_r):
        return
    rid = requests["request_id"].to_numpy(dtype=np.int64)
    if "instance_id" in requests:
        r_inst = requests["instance_id"]
        own = r_inst.astype(str).to_numpy()[it_r]
        has = ~r_inst.isna().to_numpy()[it_r]
        it_inst = items["instance_id"].astype(str).to_numpy()
        bad = first_true(~has)
        if bad is not None:
            r = int(it_r[bad])
            _refuse(wr, r, "instance_id", f"request {rid[r]} names no instance, but {wi.at(bad)} schedules it on "
                                          f"{str(it_inst[bad])!r}")
        bad = first_true(own != it_inst)
        if bad is not None:
            r = int(it_r[bad])
            _refuse(wr, r, "instance_id", f"request {rid[r]} was served by {str(own[bad])!r}, but {wi.at(bad)} schedules "
                                          f"it on {str(it_inst[bad])!r}")
    prompt = requests["prompt_tokens"].to_numpy(dtype=np.int64)
    output = requests["output_tokens"].to_numpy(dtype=np.int64)
    it_prompt = items["prompt_tokens"].to_numpy(dtype=np.int64)
    bad = first_true(it_prompt != prompt[it_r])
    if bad is not None:
        r = int(it_r[bad])
        _refuse(wr, r, "prompt_tokens", f"request {rid[r]} has {prompt[r]} prompt tokens, but {wi.at(bad)} "
                                        f"says {it_prompt[bad]}")
    reach = items["computed_before"].to_numpy(dtype=np.int64) + items["tokens"].to_numpy(dtype=np.int64)
    bad = first_true(reach > prompt[it_r] + output[it_r])
    if bad is not None:
        r = int(it_r[bad])
        _refuse(wr, r, "output_tokens", f"request {rid[r]} has prompt_tokens + output_tokens = {prompt[r]} + {output[r]}, "
                                        f"but {wi.at(bad)} schedules it up to token {reach[bad]} "
                                        "(computed_before + tokens)")
    start = steps["start_s"].to_numpy(dtype=np.float64)[it_k]
    arrival = requests["arrival_s"].to_numpy(dtype=np.float64)
    bad = first_true(~np.isfinite(arrival[it_r]))
    if bad is not None:
        r = int(it_r[bad])
        _refuse(wr, r, "arrival_s", f"request {rid[r]} has no arrival time, but {wi.at(bad)} schedules it")
    bad = first_true(start < arrival[it_r] - STEP_TIME_SLACK_S)
    if bad is not None:
        r = int(it_r[bad])
        _refuse(wr, r, "arrival_s", f"request {rid[r]} arrives (arrival_s {float(arrival[r])!r}) after the step that "
                                    f"schedules it ({wi.at(bad)}) started (start_s {float(start[bad])!r})")
    if "added_s" in requests:
        added = requests["added_s"].to_numpy(dtype=np.float64)[it_r]
        bad = first_true(np.isfinite(added) & (start < added - STEP_TIME_SLACK_S))
        if bad is not None:
            r = int(it_r[bad])
            _refuse(wr, r, "added_s", f"request {rid[r]} is handed to the engine (added_s {float(added[bad])!r}) after the "
                                      f"step that schedules it ({wi.at(bad)}) started (start_s {float(start[bad])!r})")


def _check_limits(requests: pd.DataFrame, steps: pd.DataFrame, items: pd.DataFrame, instances: pd.DataFrame,
                  inst_of_item: np.ndarray, it_k: np.ndarray, it_r: np.ndarray, where: dict[str, Where]) -> None:
    """Each step within its instance's engine: sequences no longer than
    ``max_model_len``, no more KV blocks than ``num_kv_blocks`` (per request
    always; per step summed when prefix caching is off, as nothing is
    shared then), no more sequences than ``max_num_seqs`` and tokens than
    ``max_num_batched_tokens``."""
    if not len(it_k):
        return
    wn, wi = where["instances"], where["step_items"]

    def setting(col: str, default: int = 0) -> np.ndarray:
        if col not in instances:
            return np.full(len(instances), default, dtype=np.int64)
        v = instances[col].to_numpy(dtype=np.float64)
        return np.where(np.isfinite(v) & (v > 0), v, default).astype(np.int64)

    mml = setting("max_model_len", DEFAULT_MAX_MODEL_LEN)[inst_of_item]
    bs = setting("block_size", 1)[inst_of_item]
    kv = setting("num_kv_blocks", 1)[inst_of_item]
    tokens = items["tokens"].to_numpy(dtype=np.int64)
    reach = items["computed_before"].to_numpy(dtype=np.int64) + tokens
    prompt = requests["prompt_tokens"].to_numpy(dtype=np.int64)[it_r]
    rid = requests["request_id"].to_numpy(dtype=np.int64)
    for bad_mask, col, why in (
            (prompt >= mml, "max_model_len", lambda b: f"request {rid[it_r[b]]}'s prompt of {prompt[b]} tokens is not "
                                                       "below it, yet it is scheduled"),
            (reach > mml, "max_model_len", lambda b: f"its sequence reaches {reach[b]} tokens"),
            (-(-reach // bs) > kv, "num_kv_blocks", lambda b: f"request {rid[it_r[b]]} holds {-(-reach[b] // bs[b])} "
                                                               "blocks alone")):
        bad = first_true(bad_mask)
        if bad is not None:
            i = int(inst_of_item[bad])
            _refuse(wn, i, col, f"{_shown_setting(instances, i, col, mml[bad] if col == 'max_model_len' else kv[bad])}"
                                f", but at {wi.at(bad)} {why(bad)}")
    k = len(steps)
    seqs = np.bincount(it_k, minlength=k)
    toks = np.bincount(it_k, weights=tokens, minlength=k)
    blocks = np.bincount(it_k, weights=-(-reach // bs), minlength=k)
    step_inst = np.zeros(k, dtype=np.int64)
    step_inst[it_k] = inst_of_item
    caching = instances["prefix_caching"].to_numpy() if "prefix_caching" in instances else np.zeros(len(instances))
    shared = np.array([bool(c) if c is not None and c == c else True for c in caching], dtype=bool)[step_inst]
    ws = where["steps"]
    for col, used, what in (("max_num_seqs", seqs, "sequences"), ("max_num_batched_tokens", toks, "tokens"),
                            ("num_kv_blocks", np.where(shared, 0, blocks), "KV blocks")):
        limit = setting(col, 1 << 62)[step_inst]
        bad = first_true((seqs > 0) & (used > limit))
        if bad is not None:
            i = int(step_inst[bad])
            _refuse(wn, i, col, f"{_shown_setting(instances, i, col, limit[bad])}, but step "
                                f"{int(steps['step'].iloc[bad])} ({ws.at(bad)}) schedules {int(used[bad])} {what}")


def _shown_setting(instances: pd.DataFrame, i: int, col: str, value: int) -> str:
    return f"instance {str(instances['instance_id'].iloc[i])!r} allows {col} {int(value)}"


def _check_scheduled(requests: pd.DataFrame, it_r: np.ndarray, it_inst: np.ndarray, where: dict[str, Where]) -> None:
    """A request with a measured first token on an instance that has steps
    was scheduled in one of them (else the steps are cut short, or the
    request's instance is wrong)."""
    if "ttft_s" not in requests:
        return
    ttft = requests["ttft_s"].to_numpy(dtype=np.float64)
    scheduled = np.zeros(len(requests), dtype=bool)
    scheduled[it_r] = True
    logged = set(it_inst.tolist())
    if "instance_id" in requests:
        on = requests["instance_id"].astype(str).to_numpy()
        with_steps = np.isin(on, list(logged)) & ~requests["instance_id"].isna().to_numpy()
    else:
        with_steps = np.ones(len(requests), dtype=bool)
    bad = first_true(np.isfinite(ttft) & with_steps & ~scheduled)
    if bad is not None:
        _refuse(where["requests"], bad, "request_id",
                f"request {int(requests['request_id'].iloc[bad])} has a first token (ttft_s) but is in no step of "
                f"{where['step_items'].file}")


def check_request_times(requests: pd.DataFrame, w: Where) -> None:
    """A recording's request finishes after it arrives and after its first
    token (``finish_s``, ``arrival_s`` and ``ttft_s`` on one clock)."""
    if "finish_s" not in requests:
        return
    fin = requests["finish_s"].to_numpy(dtype=np.float64)
    arr = requests["arrival_s"].to_numpy(dtype=np.float64)
    with np.errstate(invalid="ignore"):
        bad = first_true(fin < arr - STEP_TIME_SLACK_S)
        if bad is not None:
            _refuse(w, bad, "finish_s", f"finishes (finish_s {float(fin[bad])!r}) before it arrives (arrival_s {float(arr[bad])!r})")
        if "ttft_s" in requests:
            first = arr + requests["ttft_s"].to_numpy(dtype=np.float64)
            bad = first_true(fin < first - STEP_TIME_SLACK_S)
            if bad is not None:
                _refuse(w, bad, "finish_s", f"finishes (finish_s {float(fin[bad])!r}) before its first token "
                                            f"(arrival_s + ttft_s = {float(first[bad])!r})")
