"""Open-loop load generator for OpenAI-compatible completion endpoints.

Why open loop: a closed-loop client (send when the last reply arrives)
slows down with the server and hides queueing; a trace's arrival times are
kept whatever the server does, as production traffic is. Requests go to
``/v1/completions`` with ``stream: true`` so the time of every token is
seen: TTFT is the first content chunk after the send, inter-token latencies
the gaps between chunks, end-to-end latency the last chunk (the accounting
of vLLM's own ``vllm bench serve`` client, which also uses aiohttp).

Prompts are token ids (vLLM's completions API accepts a list of ints), built
by ``traces.vllm_recorder.prompts`` exactly as ``latroute record engine``
builds them, so prompt lengths and shared prefixes (``hash_ids``) are exact;
``max_tokens`` is the output length with ``ignore_eos``. ``prompt_format
words`` sends the same ids as words of ``shared/models``' word-level
tokenizer, for endpoints that only take text.

Each request carries ``X-Request-Id: <prefix><request_id>``; vLLM's server
makes its engine request id from that header, so a server-side recording
(``RecordingScheduler``) joins the client trace on it (``traces.client_join``).

Failures never vanish: a refused connection, an HTTP error status, a
malformed or cut stream, a timeout each leave the request in the output with
``status`` "error" and the reason in ``error``. aiohttp is imported lazily
(optional extra ``loadgen``).
"""
from __future__ import annotations

import asyncio
import json
import math
import time
from dataclasses import dataclass, field
from urllib.parse import urlparse

import numpy as np
import pandas as pd

from harness.live.models_endpoint import model_name as _model_name
from harness.live.models_endpoint import probe as _probe
from harness.live.record import RunFailed as RunFailed  # raised here by run_loadgen (via models_endpoint)
from harness.live.record import Workload
from traces.errors import BadInput
from traces.importers.vllm_bench import reconstruct_schedule
from traces.vllm_recorder.prompts import as_words, prompt_token_ids


@dataclass
class LoadgenConfig:
    base_url: str
    model: str | None = None
    endpoint: str = "/v1/completions"
    max_concurrency: int | None = None
    request_timeout_s: float = 600.0
    time_limit_s: float = 3600.0
    id_prefix: str = "r"
    prompt_format: str = "ids"  # ids | words
    seed: int = 0
    request_rate: float = math.inf  # for the bench JSON (arrivals generated or from a trace)
    burstiness: float = 1.0
    extra_body: dict = field(default_factory=dict)
    # several servers (``--backends``): request i goes to backends[backend_of[i]] (``assign_backends``);
    # empty: every request to base_url
    backends: tuple[str, ...] = ()
    backend_of: tuple[int, ...] = ()
    backend_names: tuple[str, ...] = ()  # instance ids for the client trace's instance_id (default: the URLs)
    # per request (the workload's order), headers sent beside X-Request-Id (``route_fields``); empty: none
    request_headers: tuple[dict[str, str], ...] = ()

    def __post_init__(self) -> None:
        """Refuse settings that would hang or flood: a NaN timeout never fires, a
        NaN rate gives NaN arrival times, 0 concurrency deadlocks."""
        def positive(name: str, x, inf_ok: bool = False) -> None:
            ok = isinstance(x, int | float) and not isinstance(x, bool) and x > 0 and (inf_ok or math.isfinite(x))
            if not ok:
                raise ValueError(f"{name} must be a {'' if inf_ok else 'finite '}number > 0, got {x!r}")

        positive("request_timeout_s", self.request_timeout_s)
        positive("time_limit_s", self.time_limit_s)
        positive("request_rate", self.request_rate, inf_ok=True)
        positive("burstiness", self.burstiness)
        if self.max_concurrency is not None and not (isinstance(self.max_concurrency, int) and self.max_concurrency >= 1):
            raise ValueError(f"max_concurrency must be an integer >= 1, got {self.max_concurrency!r}")
        if self.prompt_format not in ("ids", "words"):
            raise ValueError(f"prompt_format must be ids or words, got {self.prompt_format!r}")


@dataclass
class RequestResult:
    request_id: int
    client_id: str
    scheduled_s: float
    prompt_tokens: int
    max_tokens: int
    send_s: float = math.nan
    ttft_s: float = math.nan
    e2e_s: float = math.nan
    itls: list[float] = field(default_factory=list)
    output_tokens: int = 0
    error: str = ""
    queue_s: float = 0.0
    backend: int = -1  # index into LoadgenConfig.backends (-1: base_url)
    headers: dict[str, str] = field(default_factory=dict)  # sent beside X-Request-Id

    @property
    def ok(self) -> bool:
        return not self.error


def check_base_url(url: str) -> str:
    """Refuse a URL that cannot be an HTTP endpoint (bad input, exit 2)."""
    p = urlparse(url)
    if p.scheme not in ("http", "https") or not p.netloc:
        raise BadInput("--base-url", None, "--base-url", f"not an http(s) URL: {url!r}")
    return url.rstrip("/")


def generated_workload(num_prompts: int, request_rate: float, burstiness: float, seed: int, input_len: int,
                       output_len: int) -> Workload:
    """Arrivals drawn as ``vllm bench serve`` draws them (gamma gaps with
    shape ``burstiness``, seeded numpy, rescaled to n/rate), fixed lengths."""
    for name, n in (("num_prompts", num_prompts), ("input_len", input_len), ("output_len", output_len)):
        if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {n!r}")
    if not (request_rate > 0 and burstiness > 0 and math.isfinite(burstiness)):  # NaN fails both comparisons
        raise ValueError(f"request_rate and burstiness must be > 0, got {request_rate!r}, {burstiness!r}")
    arr = reconstruct_schedule(num_prompts, request_rate, burstiness, seed, modern=True)
    n = num_prompts
    return Workload(np.arange(n, dtype=np.int64), np.asarray(arr, dtype=np.float64),
                    np.full(n, input_len, dtype=np.int64), np.full(n, output_len, dtype=np.int64), [None] * n, 128)


def _itl_stats(itls: list[float]) -> tuple[float, float, float, float]:
    if not itls:
        return (math.nan,) * 4
    a = np.asarray(itls)
    return float(a.mean()), float(np.quantile(a, 0.5)), float(np.quantile(a, 0.9)), float(a.max())


class _Client:
    def __init__(self, cfg: LoadgenConfig, session, t0: float) -> None:
        self.cfg, self.session, self.t0 = cfg, session, t0
        self.sem = asyncio.Semaphore(cfg.max_concurrency) if cfg.max_concurrency else None
        self.models: list[str | None] = []  # per backend (GET /v1/models of each)

    async def send(self, r: RequestResult, prompt) -> RequestResult:
        try:
            if self.sem is None:
                return await self._send(r, prompt)
            q = time.perf_counter()
            async with self.sem:
                r.queue_s = time.perf_counter() - q
                return await self._send(r, prompt)
        except Exception as e:  # noqa: BLE001 - e.g. an over-long SSE line; the request is kept, with the reason
            r.error = f"client error: {type(e).__name__}: {e}"
            return r

    async def _send(self, r: RequestResult, prompt) -> RequestResult:
        import aiohttp

        cfg = self.cfg
        url = cfg.base_url if r.backend < 0 else cfg.backends[r.backend]
        model = cfg.model if r.backend < 0 else self.models[r.backend]
        body = {"model": model, "prompt": prompt, "max_tokens": r.max_tokens, "ignore_eos": True,
                "stream": True, "stream_options": {"include_usage": True}, "temperature": 0.0, **cfg.extra_body}
        start = time.perf_counter()
        r.send_s = start - self.t0
        last = start
        chunks = 0
        done = False
        try:
            async with self.session.post(url + cfg.endpoint, json=body,
                                         headers={**r.headers, "X-Request-Id": r.client_id}) as resp:
                if resp.status != 200:
                    text = (await resp.text())[:300].replace("\n", " ")
                    r.error = f"HTTP {resp.status}: {text}"
                    return r
                async for raw in resp.content:
                    line = raw.strip()
                    if not line:
                        continue
                    if not line.startswith(b"data:"):
                        r.error = f"malformed stream: line {line[:80]!r} is not an SSE data line"
                        return r
                    payload = line[5:].strip()
                    if payload == b"[DONE]":
                        done = True
                        break
                    try:
                        data = json.loads(payload)
                    except json.JSONDecodeError:
                        r.error = f"malformed stream: not JSON: {payload[:80]!r}"
                        return r
                    if not isinstance(data, dict):
                        r.error = f"malformed stream: not a JSON object: {payload[:80]!r}"
                        return r
                    if "error" in data and not data.get("choices"):
                        r.error = f"server error in stream: {json.dumps(data['error'])[:200]}"
                        return r
                    if data.get("choices"):
                        now = time.perf_counter()
                        if chunks == 0:
                            r.ttft_s = now - start
                        else:
                            r.itls.append(now - last)
                        last = now
                        chunks += 1
                    elif isinstance(data.get("usage"), dict):
                        r.output_tokens = int(data["usage"].get("completion_tokens") or 0)
        except TimeoutError:
            r.error = f"timeout after {cfg.request_timeout_s:g} s"
            return r
        except aiohttp.ClientConnectorError as e:
            r.error = f"connection failed: {e}"
            return r
        except (aiohttp.ClientError, ConnectionError) as e:
            r.error = f"connection lost: {type(e).__name__}: {e}"
            return r
        if not done:
            r.error = f"stream ended without [DONE] after {chunks} chunks"
            return r
        if chunks == 0:
            r.error = "stream had no tokens"
            return r
        r.e2e_s = last - start
        if not r.output_tokens:
            r.output_tokens = chunks
        return r


async def _run(wl: Workload, cfg: LoadgenConfig) -> tuple[list[RequestResult], float]:
    import aiohttp

    prompts = []
    for rid, p, h in zip(wl.request_id, wl.prompt_tokens, wl.hash_ids):
        ids = prompt_token_ids(int(p), h, wl.hash_block_tokens, f"{cfg.seed}:{rid}")
        prompts.append(as_words(ids) if cfg.prompt_format == "words" else ids)
    start = time.perf_counter()  # every network wait below ends by start + time_limit_s

    def left() -> float:
        return max(cfg.time_limit_s - (time.perf_counter() - start), 0.001)

    timeout = aiohttp.ClientTimeout(total=min(cfg.request_timeout_s, cfg.time_limit_s))
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        models = []
        for url in cfg.backends:  # each server serves its own model: ask each
            models.append(cfg.model if cfg.model is not None else
                          await _model_name(session, url, min(cfg.request_timeout_s, left())))
        if cfg.backends:
            cfg.model = cfg.model or models[0]
        elif cfg.model is None:
            cfg.model = await _model_name(session, cfg.base_url, min(cfg.request_timeout_s, left()))
        else:
            await _probe(session, cfg.base_url, min(cfg.request_timeout_s, left()))
        t0 = time.perf_counter()
        client = _Client(cfg, session, t0)
        client.models = models
        results = [RequestResult(int(rid), f"{cfg.id_prefix}{int(rid)}", float(a) - float(wl.arrival_s.min()),
                                 int(p), int(o), backend=cfg.backend_of[k] if cfg.backends else -1,
                                 headers=cfg.request_headers[k] if cfg.request_headers else {})
                   for k, (rid, a, p, o) in enumerate(zip(wl.request_id, wl.arrival_s, wl.prompt_tokens,
                                                          wl.output_tokens))]
        order = np.argsort([r.scheduled_s for r in results], kind="stable")
        tasks: list[asyncio.Task] = []

        async def dispatch() -> None:
            for i in order:
                r = results[i]
                delay = r.scheduled_s - (time.perf_counter() - t0)
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.create_task(client.send(r, prompts[i])))
            await asyncio.gather(*tasks)

        try:
            await asyncio.wait_for(dispatch(), timeout=left())
        except TimeoutError:
            for r in results:
                if not r.error and (math.isnan(r.send_s) or math.isnan(r.e2e_s)):
                    r.error = f"not finished within --time-limit {cfg.time_limit_s:g} s"
        duration = time.perf_counter() - t0
    return results, duration


def run_loadgen(wl: Workload, cfg: LoadgenConfig) -> tuple[list[RequestResult], float]:
    """Replay ``wl`` against ``cfg.base_url``; returns every request's
    result (failed ones included) and the run's duration. Raises RunFailed
    when the server cannot be reached at all (nothing was sent)."""
    return asyncio.run(_run(wl, cfg))


def assign_backends(request_ids: np.ndarray, n_backends: int, assignment: pd.DataFrame | None,
                    names: list[str] | None) -> tuple[int, ...]:
    """The backend of each request: the instance an offline replay chose
    (``assignment``: its request_id and instance_id, ``names`` the
    instances in pool order, backend k serving instance k), else round
    robin. BadInput: a request the replay did not place, or an instance
    beyond the backends."""
    if assignment is None:
        return tuple(int(k % n_backends) for k in range(len(request_ids)))
    index = {name: k for k, name in enumerate(names or [])}
    where = dict(zip(assignment["request_id"].to_numpy().tolist(), assignment["instance_id"].tolist()))
    out = []
    for rid in request_ids.tolist():
        inst = where.get(rid)
        if inst is None or inst not in index:
            raise BadInput("--assign-from", None, "request_id",
                           f"request {rid}: {'not in the replay' if rid not in where else 'not placed by it'}")
        if index[inst] >= n_backends:
            raise BadInput("--backends", None, "--backends",
                           f"request {rid} went to instance {inst} (#{index[inst]} of the pool); only "
                           f"{n_backends} backends given")
        out.append(index[inst])
    return tuple(out)


def requests_frame(results: list[RequestResult], hash_ids: list | None = None,
                   backend_names: tuple[str, ...] = ()) -> pd.DataFrame:
    """The client trace's ``requests`` table: arrival_s is the measured send
    time (s since the run's start), ttft_s/finish_s/e2e_s and ITL statistics
    measured, NaN for a failed request, whose ``error`` says why."""
    rows = []
    for k, r in enumerate(results):
        mean, p50, p90, mx = _itl_stats(r.itls)
        send = r.send_s if not math.isnan(r.send_s) else r.scheduled_s
        rows.append({
            "request_id": r.request_id, "arrival_s": send, "prompt_tokens": r.prompt_tokens,
            "output_tokens": r.output_tokens if r.ok else r.max_tokens,
            "ttft_s": r.ttft_s if r.ok else math.nan,
            "finish_s": send + r.e2e_s if r.ok else math.nan,
            "hash_ids": None if hash_ids is None else hash_ids[k],
            "client_id": r.client_id, "status": "ok" if r.ok else "error", "error": r.error or None,
            "e2e_s": r.e2e_s if r.ok else math.nan,
            "itl_mean_s": mean, "itl_p50_s": p50, "itl_p90_s": p90, "itl_max_s": mx,
            **({"instance_id": backend_names[r.backend]} if backend_names and r.backend >= 0 else {}),
        })
    df = pd.DataFrame(rows)
    if hash_ids is None or all(h is None for h in hash_ids):
        df = df.drop(columns=["hash_ids"])
    return df.sort_values(["arrival_s", "request_id"], kind="stable").reset_index(drop=True)


def _metric(values: list[float], name: str, percentiles=(99,)) -> dict:
    a = np.asarray(values, dtype=np.float64) * 1e3
    out = {f"mean_{name}_ms": float(a.mean()) if a.size else 0.0,
           f"median_{name}_ms": float(np.median(a)) if a.size else 0.0,
           f"std_{name}_ms": float(a.std()) if a.size else 0.0}
    for p in percentiles:
        out[f"p{p:g}_{name}_ms"] = float(np.percentile(a, p)) if a.size else 0.0
    return out


def bench_result(results: list[RequestResult], duration: float, cfg: LoadgenConfig, num_prompts: int,
                 date: str) -> dict:
    """A result JSON with ``vllm bench serve``'s keys (0.32), so tools that
    read those files (``latroute trace import vllm-bench`` among them) read
    this one. ``start_times`` are the measured send times."""
    ok = [r for r in results if r.ok]
    tpots = [(r.e2e_s - r.ttft_s) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1]
    total_out = sum(r.output_tokens for r in ok)
    total_in = sum(r.prompt_tokens for r in ok)
    doc = {
        "date": date, "endpoint_type": "openai", "backend": "openai", "label": "latroute-loadgen",
        "model_id": cfg.model, "tokenizer_id": cfg.model, "num_prompts": num_prompts,
        "request_rate": "inf" if math.isinf(cfg.request_rate) else cfg.request_rate,
        "burstiness": cfg.burstiness, "max_concurrency": cfg.max_concurrency, "seed": cfg.seed,
        "duration": duration, "completed": len(ok), "failed": len(results) - len(ok),
        "total_input_tokens": total_in, "total_output_tokens": total_out,
        "request_throughput": len(ok) / duration if duration else 0.0, "request_goodput": None,
        "output_throughput": total_out / duration if duration else 0.0,
        "total_token_throughput": (total_in + total_out) / duration if duration else 0.0,
        "input_lens": [r.prompt_tokens for r in results],
        "output_lens": [r.output_tokens if r.ok else 0 for r in results],
        "ttfts": [r.ttft_s if r.ok else 0.0 for r in results],
        "itls": [r.itls if r.ok else [] for r in results],
        "latencies": [r.e2e_s if r.ok else 0.0 for r in results],
        "start_times": [r.send_s if not math.isnan(r.send_s) else r.scheduled_s for r in results],
        "queue_times": [r.queue_s for r in results],
        "generated_texts": ["" for _ in results],
        "errors": [r.error for r in results],
        "request_ids": [r.client_id for r in results],
    }
    doc.update(_metric([r.ttft_s for r in ok], "ttft"))
    doc.update(_metric(tpots, "tpot"))
    doc.update(_metric([x for r in ok for x in r.itls], "itl"))
    doc.update(_metric([r.e2e_s for r in ok], "e2el"))
    return doc
