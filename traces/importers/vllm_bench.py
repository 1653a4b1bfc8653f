"""Result JSON of ``vllm bench serve`` / ``benchmark_serving.py --save-result``.

Per-request arrays: ``input_lens``, ``output_lens``, ``ttfts`` (s), ``itls``
(list per request, s; kept whole in ``itls_s``: calibration reads the steps
other requests joined from them) and ``errors``. The file saves no send times in most
versions, so arrival times come from, in order of preference:

1. ``start_times`` when the file has them (measured);
2. the benchmark's own schedule when the file says how it was drawn:
   ``request_rate`` inf means every request at t = 0; a finite rate with
   ``burstiness`` (default 1) and no ``max_concurrency`` or ramp-up is
   replayed exactly as the client drew it, ``np.random.seed(seed)`` then
   ``np.random.gamma(burstiness, 1/(rate*burstiness))`` gaps (seed:
   ``--seed``, else the file's ``seed``, else ``--seed`` in its recorded
   command, else the client's default 0) -- the legacy script sleeps a gap
   after each request; ``vllm bench serve`` (files with ``endpoint_type``)
   gaps every request and rescales the last time to n/rate;
3. otherwise arrivals are unknown: ``arrival_s`` is null and meta.json says
   ``arrivals: unknown``.

The per-request arrays list every request the client sent, failed ones
included (with an error and no TTFT); ``num_prompts`` says how many were
sent. A run with failed or missing requests is refused unless
``--allow-incomplete`` (``traces.importers.completeness``): the failed are
rarely a random sample. The engine settings the file implies (the GPU of
``_gpu_type``, the parallel sizes of a ``tpN_ppM`` file name) and vLLM's
defaults for the rest are marked in meta.json (``engine_settings``).

No sessions: the file keeps no conversation id (and the benchmark's
ShareGPT dataset sends each conversation's first exchange only), so the
trace has no ``session``, ``turn`` or ``hash_ids`` (docs/reference/importers.md).
"""
from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pandas as pd

from traces.datamodel.limits import MAX_EPOCH_S, shown
from traces.errors import BadInput
from traces.files.jsonio import read_json
from traces.importers.common import ImportOptions, RequestSink, json_number, require_file
from traces.importers.completeness import counted, enforce, ranges
from traces.importers.engine_settings import GIVEN, INFERRED, Stated, assemble, parse_engine_overrides
from traces.importers.unmodelled import check_accept_keys
from traces.store import TraceWriter

BENCHMARK_DEFAULT_SEED = 0
_SEED_RE = re.compile(r"--seed[= ]+(\d+)")
_PARALLEL_RE = re.compile(r"(?<![a-z])tp(\d+)_pp(\d+)(?![0-9])", re.I)
MIN_RATE, MAX_RATE = 1e-6, 1e9  # requests/s: outside, the drawn gaps overflow or underflow a float


def reconstruct_schedule(n: int, rate: float, burstiness: float, seed: int, modern: bool = False) -> np.ndarray:
    """The send time of each request as the benchmark client schedules it.

    Legacy ``benchmark_serving.py``: request i is sent, then the client
    sleeps one gamma gap, so the first request goes at t = 0. ``vllm bench
    serve`` (0.33): every request, the first included, gets a gap, and the
    accumulated times are rescaled so the last one is exactly n / rate."""
    if math.isinf(rate) or n == 0:
        return np.zeros(n)
    state = np.random.RandomState(seed)  # the client seeds numpy's global legacy generator
    gaps = state.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=n)
    if not modern:
        return np.concatenate(([0.0], np.cumsum(gaps[:-1])))
    times = np.cumsum(gaps)
    return times * ((n / rate) / times[-1]) if times[-1] > 0 else times


def _rate(value, src: Path) -> float | None:
    if value is None:
        return None
    if isinstance(value, str):
        if value.strip().lower() in ("inf", "infinity"):
            return math.inf
        try:
            value = float(value)
        except ValueError:
            raise BadInput(src, None, "request_rate", f"not a number: {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise BadInput(src, None, "request_rate", f"must be a positive number or inf, got {shown(value)}")
    if not math.isinf(value) and not MIN_RATE <= value <= MAX_RATE:
        raise BadInput(src, None, "request_rate", f"{shown(value)} is outside [{MIN_RATE:g}, {MAX_RATE:g}] requests/s")
    return float(value)


def _burstiness(doc: dict, src: Path) -> float:
    """The gamma shape of the client's gaps (default 1): a positive finite number."""
    value = doc.get("burstiness")
    if value is None:
        return 1.0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 1e-6 <= value <= 1e6:
        raise BadInput(src, None, "burstiness", f"must be a positive number in [1e-06, 1e+06], got {shown(value)}")
    return float(value)


def _seed(doc: dict, opts: ImportOptions, src: Path) -> tuple[int, str]:
    if opts.seed is not None:
        return opts.seed, "--seed option"
    seed = doc.get("seed")
    if seed is not None:
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32:
            raise BadInput(src, None, "seed", f"must be a whole number in [0, 2**32), as numpy seeds, got {shown(seed)}")
        return seed, "file's seed field"
    m = _SEED_RE.search(str(doc.get("_client_command", "")) + " " + str(doc.get("command", "")))
    if m:
        if int(m.group(1)) >= 2**32:
            raise BadInput(src, None, "command", f"--seed {shown(m.group(1))} is not a numpy seed (< 2**32)")
        return int(m.group(1)), "--seed in the recorded client command"
    return BENCHMARK_DEFAULT_SEED, "client default seed 0"


def _array(doc: dict, key: str, src: Path, n: int | None) -> list:
    v = doc.get(key)
    if v is None:
        raise BadInput(src, None, key, "missing column")
    if not isinstance(v, list):
        raise BadInput(src, None, key, "not a list")
    if n is not None and len(v) != n:
        raise BadInput(src, None, key, f"has {len(v)} entries but input_lens has {n}")
    return v


def _numbers(values: list, key: str, src: Path, integer: bool, allow_null: bool = False,
             maximum: float | None = None) -> np.ndarray:
    return np.array([np.nan if v is None and allow_null else json_number(v, key, src, i + 1, integer, maximum)
                     for i, v in enumerate(values)], dtype=np.float64)


def _itl_lists(itls: list, src: Path) -> list:
    """Per request, its inter-token latencies (None where the entry is not
    a list, as for a failed request); each a number >= 0."""
    out: list = []
    for i, x in enumerate(itls):
        if not isinstance(x, list):
            out.append(None)
            continue
        values = [json_number(v, "itls", src, i + 1) for v in x]
        if any(v < 0 for v in values):
            raise BadInput(src, i + 1, "itls", "an inter-token latency below 0")
        out.append([float(v) for v in values])
    return out


def _stated_engine(doc: dict, src: Path) -> dict[str, Stated]:
    """What the file says of its server: the GPU (``_gpu_type``, or ``gpu``), the tensor and pipeline
    parallel sizes from a ``tpN_ppM`` in its recorded source name (or its own)."""
    out: dict[str, Stated] = {}
    for key in ("_gpu_type", "gpu"):
        v = doc.get(key)
        if isinstance(v, str) and v.strip():
            out["gpu"] = Stated(v.strip()[:200], GIVEN, f"{src.name} {key}")
            break
    for name in (doc.get("_source_file"), src.name):
        m = _PARALLEL_RE.search(str(name or ""))
        if m:
            how = f"the run's name {shown(Path(str(name)).name, 80)} says tp{m.group(1)}_pp{m.group(2)}"
            out["tensor_parallel_size"] = Stated(max(1, int(m.group(1))), INFERRED, how)
            out["pipeline_parallel_size"] = Stated(max(1, int(m.group(2))), INFERRED, how)
            break
    return out


def _run_date(doc: dict) -> str | None:
    """The run's day from the result's ``date`` (``YYYYMMDD-HHMMSS``, the client's local time)."""
    m = re.match(r"^(\d{4})(\d{2})(\d{2})-", str(doc.get("date") or ""))
    return f"{m.group(1)}-{m.group(2)}-{m.group(3)}" if m else None


def _completeness(doc: dict, src: Path, n: int, failed: np.ndarray):
    """``num_prompts`` (else the arrays' length: they list failed requests too) against the requests served."""
    sent = doc.get("num_prompts")
    if sent is not None:
        sent = int(json_number(sent, "num_prompts", src, None, integer=True))
        how = "the file's num_prompts"
    else:
        sent, how = n, "the file's per-request arrays, which list failed requests too"
    where = []
    if failed.any():
        where.append(f"{int(failed.sum())} failed (request {ranges(np.flatnonzero(failed))} in send order)")
    if sent > n:
        where.append(f"{sent - n} not in the file")
    return counted(sent, n - int(failed.sum()), how, "; ".join(where))


def import_vllm_bench(src: Path, writer: TraceWriter, opts: ImportOptions) -> list[str]:
    require_file(src)
    overrides = parse_engine_overrides(opts.engine)
    accepted = check_accept_keys(opts.accept_unmodelled)
    doc = read_json(src, "file")
    if not isinstance(doc, dict):
        raise BadInput(src, 1, "file", "not a JSON object (expected a benchmark result)")
    inp = _array(doc, "input_lens", src, None)
    n = len(inp)
    if n == 0:
        raise BadInput(src, None, "input_lens", "no requests")
    prompt = _numbers(inp, "input_lens", src, integer=True).astype(np.int64)
    output = _numbers(_array(doc, "output_lens", src, n), "output_lens", src, integer=True).astype(np.int64)
    ttft = _numbers(_array(doc, "ttfts", src, n), "ttfts", src, integer=False, allow_null=True)
    errors = doc.get("errors") or [""] * n
    if not isinstance(errors, list):
        raise BadInput(src, None, "errors", "not a list")
    if len(errors) != n:
        raise BadInput(src, None, "errors", f"has {len(errors)} entries but input_lens has {n}")
    failed = np.array([bool(e) for e in errors])
    ttft[failed] = np.nan
    done = _completeness(doc, src, n, failed)
    notes: list[str] = enforce(done, opts.allow_incomplete, src, "num_prompts" if "num_prompts" in doc else "errors")
    cfg = assemble(_stated_engine(doc, src), overrides, int((prompt + output).max()), src, (), accepted,
                   run_date=_run_date(doc))
    itl_sum = itl_lists = None
    if isinstance(doc.get("itls"), list):
        itl_lists = _itl_lists(_array(doc, "itls", src, n), src)
        itl_sum = np.array([np.nan if x is None else float(sum(x)) for x in itl_lists])

    rate = _rate(doc.get("request_rate"), src)
    burstiness = _burstiness(doc, src)
    order = np.arange(n)
    how: dict = {}
    if isinstance(doc.get("start_times"), list):
        st = _numbers(_array(doc, "start_times", src, n), "start_times", src, integer=False, maximum=MAX_EPOCH_S)
        arrival = st - st.min()
        order = np.argsort(arrival, kind="stable")
        if (order != np.arange(n)).any():
            notes.append("requests sorted by start time")
        kind = "measured"
        how = {"from": "start_times"}
    elif rate is not None and (math.isinf(rate) or (doc.get("max_concurrency") is None
                                                   and not doc.get("ramp_up_strategy"))):
        seed, seed_from = _seed(doc, opts, src)
        modern = "endpoint_type" in doc  # vllm bench serve; the legacy script has no such key
        arrival = reconstruct_schedule(n, rate, float(burstiness), seed, modern)
        kind = "reconstructed"
        how = {"from": "request_rate schedule", "request_rate": "inf" if math.isinf(rate) else rate,
               "burstiness": burstiness,
               "seed": None if math.isinf(rate) else seed, "seed_from": None if math.isinf(rate) else seed_from,
               "client": "vllm bench serve (rescaled to n/rate)" if modern else "legacy benchmark_serving.py"}
        notes.append("arrival times reconstructed from the benchmark's schedule "
                     + ("(request_rate inf: all at t=0)" if math.isinf(rate)
                        else f"(rate {rate:g}/s, burstiness {burstiness:g}, seed {seed} from {seed_from})"))
    else:
        arrival = np.full(n, np.nan)
        kind = "unknown"
        how = {"from": None, "why": "no start_times, and the schedule cannot be replayed "
                                    "(no request_rate, or max_concurrency / ramp-up gated the sends)"}
        notes.append("arrival times unknown: arrival_s left null")

    finish = arrival + ttft + itl_sum if itl_sum is not None else np.full(n, np.nan)
    df = pd.DataFrame({
        "arrival_s": arrival,
        "prompt_tokens": prompt,
        "output_tokens": output,
        "ttft_s": ttft,
        "finish_s": finish,
        **({"itls_s": pd.Series(itl_lists, dtype=object)} if itl_lists is not None else {}),
    }).iloc[order].reset_index(drop=True)
    if failed.any():
        notes.append(f"{int(failed.sum())} failed requests kept with ttft_s null")
    with writer.table("requests") as tw:
        RequestSink(tw, src).write(df, order + 1)
    writer.meta["source"] = {"kind": "vllm-bench", "file": str(src), "model": doc.get("model_id"),
                             "backend": doc.get("backend"), "date": doc.get("date"),
                             "failed": int(failed.sum()), "arrival_schedule": how}
    writer.meta["arrivals"] = kind
    writer.meta["engine"] = cfg.to_meta()
    writer.meta["completeness"] = done.to_meta()
    return notes + cfg.lines()
