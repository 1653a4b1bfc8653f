"""``latroute loadgen``: open-loop load against an OpenAI-compatible endpoint."""
from __future__ import annotations

import datetime as _dt
import math
import sys
from pathlib import Path

import click

from harness.cli.extras import require_extra
from harness.cli.params import (
    BURSTINESS,
    COUNT,
    MAX_MAGNITUDE,
    MIN_MAGNITUDE,
    POSITIVE,
    SEED,
    TOKENS,
    Finite,
    IntIn,
    check_id_prefix,
    server_urls,
)
from traces.errors import BadInput, BadOption

# The load generator, its workload and the trace store load numpy, pandas, duckdb and (sending) aiohttp:
# imported where a run starts, so that ``latroute loadgen --help`` does not pay for them.


@click.command()
@click.option("--base-url", help="Server root, e.g. http://127.0.0.1:8765 (or --backends).")
@click.option("--backends", help="Several server roots, comma-separated (an emulated pool, `latroute serve`): "
                                 "requests round robin, or as --assign-from says.")
@click.option("--assign-from", "assign_from", type=click.Path(path_type=Path),
              help="A replay's result directory: send each request to the instance that replay chose "
                   "(backend k serves the pool's instance k).")
@click.option("--trace", "trace_dir", type=click.Path(path_type=Path),
              help="Replay this trace's arrivals, lengths and hash_ids (else arrivals are generated).")
@click.option("--out", required=True, type=click.Path(path_type=Path),
              help="Client trace directory to create (with bench.json inside).")
@click.option("--model", help="Model name for the API (default: the first of GET /v1/models).")
@click.option("--num-prompts", type=COUNT, help="Requests to send (with --trace: its first N).")
@click.option("--request-rate", type=Finite(MIN_MAGNITUDE, MAX_MAGNITUDE, allow_inf=True), default=math.inf,
              show_default=True,
              help="Requests per second when generating arrivals (inf: all at once).")
@click.option("--burstiness", type=BURSTINESS, default=1.0, show_default=True,
              help="Gamma shape of the gaps (1: Poisson), as vllm bench serve.")
@click.option("--seed", type=SEED, default=0, show_default=True, help="Seed of arrivals and prompt tokens.")
@click.option("--max-concurrency", type=IntIn(1, 10**6), help="At most this many requests in flight.")
@click.option("--input-len", type=TOKENS, default=256, show_default=True,
              help="Prompt tokens per generated request.")
@click.option("--output-len", type=TOKENS, default=64, show_default=True,
              help="Output tokens per generated request.")
@click.option("--hash-block-tokens", type=IntIn(1, 2**20), help="Tokens per hash_ids block (default: meta.json).")
@click.option("--id-prefix", default="r", show_default=True,
              help="X-Request-Id is this prefix + request_id (at most 64 printable ASCII characters, no spaces).")
@click.option("--prompt-format", type=click.Choice(["ids", "words"]), default="ids", show_default=True,
              help="ids: a list of token ids; words: w<id> text for text-only endpoints.")
@click.option("--request-timeout", type=POSITIVE, default=600.0, show_default=True,
              help="Seconds one request may take before it is recorded as failed (timeout).")
@click.option("--time-limit", type=POSITIVE, default=3600.0, show_default=True,
              help="Seconds after which unfinished requests are abandoned (counted as failed); bounds every "
                   "network wait, GET /v1/models included.")
@click.option("--route-fields", is_flag=True,
              help="With --trace: send each request's SLO, predicted length and per-model predicted accuracy "
                   "(slo_ttft_s, predicted_output_tokens, the quality table's acc_hat) as the headers "
                   "`latroute route` reads, so the proxy routes on the trace's inputs, as replay does.")
@click.option("--force", is_flag=True, help="Replace --out if it exists.")
def loadgen(base_url: str | None, backends: str | None, assign_from: Path | None, trace_dir: Path | None, out: Path, model: str | None, num_prompts: int | None,
            request_rate: float, burstiness: float, seed: int, max_concurrency: int | None, input_len: int,
            output_len: int, hash_block_tokens: int | None, id_prefix: str, prompt_format: str,
            request_timeout: float, time_limit: float, route_fields: bool, force: bool) -> None:
    """Replay arrivals open loop against /v1/completions (streaming) and measure.

    Per request: TTFT, inter-token latencies, end-to-end latency, or the
    error (a failed request is kept, never dropped). Writes a latroute trace
    (requests with measured ttft_s, itl_* statistics, status, error) and
    OUT/bench.json with `vllm bench serve`'s keys. Exit 1 if any request
    failed (the output is written whole, each failure in it) or the server
    cannot be reached or every request failed (nothing written); exit 2 for
    bad input (an answer of /v1/models that is not a model list among it).
    Every wait on the network ends within --time-limit.

    \b
    Examples:
      latroute loadgen --base-url http://127.0.0.1:8765 --trace d1 --out client-d1
      latroute loadgen --base-url http://127.0.0.1:8765 --num-prompts 200 --request-rate 2 --out client
      latroute loadgen --backends http://127.0.0.1:8100,http://127.0.0.1:8101,http://127.0.0.1:8102 \\
          --trace r-sq/served --assign-from r-sq --out client-sq   # each request where replay r-sq sent it
    """
    require_extra("loadgen", "loadgen")  # before anything else: without aiohttp nothing can be sent
    if (base_url is None) == (backends is None):
        raise BadOption("--base-url", "give --base-url URL or --backends URL,... (exactly one)")
    urls = server_urls(backends, "--backends") if backends is not None else ()
    if base_url is not None and "," in base_url:
        raise BadOption("--base-url", "one URL (several servers: --backends)")
    url = server_urls(base_url, "--base-url")[0] if base_url is not None else urls[0]
    if assign_from is not None and not urls:
        raise BadOption("--assign-from", "needs --backends (one URL per instance of the pool)")
    if assign_from is not None and trace_dir is None:
        raise BadOption("--assign-from", "needs --trace (the replay's input: its requests are assigned by request id)")
    check_id_prefix(id_prefix)
    from traces.files.outputs import check_out, write_json

    check_out(out, force, inputs=[trace_dir, assign_from])  # before any work
    import numpy as np

    from harness.live.loadgen import (
        LoadgenConfig,
        assign_backends,
        bench_result,
        generated_workload,
        requests_frame,
        run_loadgen,
    )
    from harness.live.record import RunFailed, read_workload
    from harness.live.route_fields import route_fields as _route_fields
    from traces.store import TraceWriter, open_trace

    if trace_dir is not None:
        if not math.isinf(request_rate) or burstiness != 1.0:
            raise BadInput("--request-rate", None, "--request-rate",
                           "applies when loadgen generates arrivals; a --trace has its own")
        wl = read_workload(open_trace(trace_dir), hash_block_tokens)
        if num_prompts is not None:
            for name in ("request_id", "arrival_s", "prompt_tokens", "output_tokens"):
                setattr(wl, name, getattr(wl, name)[:num_prompts])
            wl.hash_ids = wl.hash_ids[:num_prompts]
    else:
        if num_prompts is None:
            raise BadInput("--num-prompts", None, "--num-prompts", "give --trace DIR or --num-prompts N")
        wl = generated_workload(num_prompts, request_rate, burstiness, seed, input_len, output_len)
    if route_fields and trace_dir is None:
        raise BadInput("--route-fields", None, "--route-fields", "needs --trace (the fields come from it)")
    headers = _route_fields(open_trace(trace_dir), wl.request_id) if route_fields else ()
    names: list[str] = list(urls)
    assignment = None
    if assign_from is not None:
        served = assign_from / "served"  # a replay's result directory holds its served trace there
        t_assign = open_trace(served if (served / "meta.json").is_file() else assign_from)
        names = t_assign.read("instances")["instance_id"].tolist()
        assignment = t_assign.read("requests")[["request_id", "instance_id"]]
    backend_of = assign_backends(np.asarray(wl.request_id), len(urls), assignment, names) if urls else ()
    cfg = LoadgenConfig(base_url=url, backends=urls, backend_of=backend_of, backend_names=tuple(names[:len(urls)]),
                        model=model, max_concurrency=max_concurrency, request_timeout_s=request_timeout,
                        time_limit_s=time_limit, id_prefix=id_prefix, prompt_format=prompt_format, seed=seed,
                        request_rate=request_rate, burstiness=burstiness, request_headers=headers)
    date = _dt.datetime.now(_dt.UTC).strftime("%Y%m%d-%H%M%S")
    # the load runs before anything is created: an unreachable server, or a run in which every request
    # failed, leaves no directory behind (not even --out's parents); a partly failed run is written whole
    try:
        results, duration = run_loadgen(wl, cfg)
    except RunFailed as e:
        click.echo(f"error: {e} (nothing written)", err=True)
        sys.exit(1)
    ok = [r for r in results if r.ok]
    failed = len(results) - len(ok)
    if not ok:
        first = results[0]
        click.echo(f"error: every request failed ({failed} of {len(results)}; first: request {first.request_id}: "
                   f"{first.error}) (nothing written)", err=True)
        sys.exit(1)
    with TraceWriter(out, force) as w:
        has_hash = any(h for h in wl.hash_ids)
        w.meta["source"] = {"kind": "loadgen", "base_url": url, "backends": list(urls) or None,
                            "assign_from": str(assign_from) if assign_from else None, "endpoint": cfg.endpoint, "model": cfg.model,
                            "trace": str(trace_dir) if trace_dir else None, "id_prefix": id_prefix,
                            "prompt_format": prompt_format, "seed": seed, "max_concurrency": max_concurrency,
                            "request_rate": None if math.isinf(request_rate) else request_rate,
                            "burstiness": burstiness, "duration_s": duration, "argv": sys.argv[1:]}
        w.meta["arrivals"] = "measured"
        if has_hash:
            w.meta["hash_block_tokens"] = wl.hash_block_tokens
        w.write_table("requests", requests_frame(results, wl.hash_ids if has_hash else None, cfg.backend_names))
        write_json(w.tmp / "bench.json", bench_result(results, duration, cfg, len(results), date))
    ttft = np.array([r.ttft_s for r in ok]) * 1e3
    click.echo(f"loadgen {len(results)} requests in {duration:.1f} s: {len(ok)} ok, {failed} failed; "
               f"TTFT median {np.median(ttft):.1f} ms, p90 {np.quantile(ttft, 0.9):.1f} ms")
    click.echo(f"wrote {out} (requests.parquet, bench.json)")
    if failed:
        first = next(r for r in results if not r.ok)
        click.echo(f"error: {failed} of {len(results)} requests failed (first: request {first.request_id}: "
                   f"{first.error})", err=True)
        sys.exit(1)
