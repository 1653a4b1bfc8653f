"""Checks of a vLLM recording's engine.json and requests.csv that no single
cell shows: the types of engine.json's optional keys (``"false"`` as a
string is true in Python), a request's first token against its arrival and
TTFT, its prefix-cache columns against its prompt. Apart from
``traces.importers.vllm_record`` so that module stays one reader's size;
the checks across requests and steps are ``traces.checks.consistency``.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from traces.checks.consistency import Where
from traces.checks.frame_checks import STEP_TIME_SLACK_S, first_true
from traces.datamodel.limits import shown
from traces.errors import BadInput

if TYPE_CHECKING:
    import pandas as pd

BOOL_KEYS = ("prefix_caching", "async_scheduling", "chunked_prefill")
TEXT_KEYS = ("vllm_version", "platform", "dtype")
INT_KEYS = ("kv_blocks_override",)
TTFT_SLACK_S = 1e-6  # ttft_s is first_token_s - arrival_s to the recorder's float precision


def check_engine_types(eng: dict, path: Path) -> None:
    """engine.json's optional keys, when given, of the type the recorder
    writes: booleans true/false (never strings), text, whole numbers, an
    object for ``model_config``. null means not recorded."""
    for key in BOOL_KEYS:
        v = eng.get(key)
        if v is not None and not isinstance(v, bool):
            raise BadInput(path, None, key, f"must be true or false, got {shown(v)}")
    for key in TEXT_KEYS:
        v = eng.get(key)
        if v is not None and not isinstance(v, str):
            raise BadInput(path, None, key, f"must be a string, got {shown(v)}")
    for key in INT_KEYS:
        v = eng.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            raise BadInput(path, None, key, f"must be a whole number >= 0, got {shown(v)}")
    v = eng.get("model_config")
    if v is not None and not isinstance(v, dict):
        raise BadInput(path, None, "model_config", f"must be a JSON object, got {shown(v)}")


def check_first_tokens(requests: pd.DataFrame, first_token: np.ndarray, w: Where) -> None:
    """first_token_s after the arrival and handing-over, ttft_s equal to
    first_token_s - arrival_s, the finish not before the first token."""
    arrival = requests["arrival_s"].to_numpy(dtype=np.float64)
    ttft = requests["ttft_s"].to_numpy(dtype=np.float64)
    with np.errstate(invalid="ignore"):
        bad = first_true(first_token < arrival - STEP_TIME_SLACK_S)
        if bad is not None:
            raise BadInput(w.file, w.row_of(bad), "first_token_s",
                           f"first token at {float(first_token[bad])!r} s, before the arrival ({float(arrival[bad])!r} s)")
        if "added_s" in requests:
            added = requests["added_s"].to_numpy(dtype=np.float64)
            bad = first_true(added < arrival - STEP_TIME_SLACK_S)
            if bad is not None:
                raise BadInput(w.file, w.row_of(bad), "added_s",
                               f"handed to the engine at {float(added[bad])!r} s, before the arrival ({float(arrival[bad])!r} s)")
            bad = first_true(first_token < added - STEP_TIME_SLACK_S)
            if bad is not None:
                raise BadInput(w.file, w.row_of(bad), "first_token_s", f"first token at {float(first_token[bad])!r} s, "
                                                                        f"before it was handed over ({float(added[bad])!r} s)")
        gap = np.abs(first_token - arrival - ttft)
        bad = first_true(np.isfinite(first_token) & np.isfinite(ttft) & (gap > TTFT_SLACK_S * (1 + np.abs(first_token))))
        if bad is not None:
            raise BadInput(w.file, w.row_of(bad), "ttft_s", f"{float(ttft[bad])!r} is not first_token_s - arrival_s "
                                                            f"({float(first_token[bad] - arrival[bad])!r})")
        bad = first_true(np.isfinite(ttft) ^ np.isfinite(first_token))
        if bad is not None:
            raise BadInput(w.file, w.row_of(bad), "ttft_s", "given without first_token_s, or the other way round")
        fin = requests["finish_s"].to_numpy(dtype=np.float64)
        bad = first_true(fin < first_token - STEP_TIME_SLACK_S)
        if bad is not None:
            raise BadInput(w.file, w.row_of(bad), "finish_s",
                           f"finishes ({float(fin[bad])!r} s) before its first token ({float(first_token[bad])!r} s)")


def check_request_lengths(requests: pd.DataFrame, eng: dict, w: Where) -> None:
    """A prefix-caching recording's ``hash_ids`` (one per full engine block
    of the prompt, so no more than prompt_tokens // block_size) and
    ``cached_tokens`` (a hit of whole blocks within the prompt, none
    without prefix caching)."""
    prompt = requests["prompt_tokens"].to_numpy(dtype=np.int64)
    bs = int(eng["block_size"])
    if "hash_ids" in requests:
        counts = np.array([0 if h is None else len(h) for h in requests["hash_ids"]], dtype=np.int64)
        bad = first_true(counts > prompt // bs)
        if bad is not None:
            raise BadInput(w.file, w.row_of(bad), "hash_ids",
                           f"{counts[bad]} ids, but a prompt of {prompt[bad]} tokens has {prompt[bad] // bs} full "
                           f"blocks of {bs} (engine.json block_size)")
    if "cached_tokens" in requests:
        cached = requests["cached_tokens"].to_numpy(dtype=np.float64)
        with np.errstate(invalid="ignore"):
            bad = first_true(cached > prompt)
            if bad is not None:
                raise BadInput(w.file, w.row_of(bad), "cached_tokens",
                               f"{int(cached[bad])} cached tokens, above the prompt's {prompt[bad]}")
            if not eng.get("prefix_caching"):
                bad = first_true(cached > 0)
                if bad is not None:
                    raise BadInput(w.file, w.row_of(bad), "cached_tokens", f"{int(cached[bad])} cached tokens, but "
                                                                           "engine.json has prefix caching off")
            bad = first_true(np.isfinite(cached) & (cached % bs != 0))
            if bad is not None:
                raise BadInput(w.file, w.row_of(bad), "cached_tokens",
                               f"{int(cached[bad])} is not a whole number of blocks of {bs} (engine.json block_size)")


def check_token_times(requests: pd.DataFrame, first_token: np.ndarray, log, w: Where, steps_name: str) -> None:
    """A request's first token comes no earlier than the end of the first
    step that scheduled it, its finish no earlier than the end of the last
    one. (A finish after the last step is left alone: a steps.jsonl cut at a
    line boundary is told from a whole one by the first tokens only, as
    tests/test_adversarial_inputs_props.py expects.)"""
    import pandas as pd

    items = log.step_items
    if not len(items):
        return
    ends = pd.Series(log.steps["end_s"].to_numpy(dtype=np.float64), index=log.steps["step"].to_numpy())
    item_end = ends.loc[items["step"].to_numpy()].to_numpy()
    per = pd.DataFrame({"r": items["request_id"].to_numpy(), "e": item_end}).groupby("r")["e"].agg(["min", "max"])
    rid = requests["request_id"].to_numpy()
    first_end = per["min"].reindex(rid).to_numpy(dtype=np.float64)
    last_end = per["max"].reindex(rid).to_numpy(dtype=np.float64)
    fin = requests["finish_s"].to_numpy(dtype=np.float64)
    with np.errstate(invalid="ignore"):
        bad = first_true(first_token < first_end - STEP_TIME_SLACK_S)
        if bad is not None:
            raise BadInput(w.file, w.row_of(bad), "first_token_s",
                           f"first token at {float(first_token[bad])!r} s, before the first step of {steps_name} "
                           f"that schedules it ended ({float(first_end[bad])!r} s)")
        bad = first_true(fin < last_end - STEP_TIME_SLACK_S)
        if bad is not None:
            raise BadInput(w.file, w.row_of(bad), "finish_s",
                           f"finishes at {float(fin[bad])!r} s, before the last step of {steps_name} that schedules "
                           f"it ended ({float(last_end[bad])!r} s)")
