"""``latroute record ...``: recordings of a real vLLM engine."""
from __future__ import annotations

import sys
from pathlib import Path

import click

from harness.cli.params import POSITIVE, SEED, TOKENS, Finite, IntIn

# The recorder's driver and the trace store load numpy, pandas and duckdb: imported where a command runs, so
# that ``latroute record ... --help`` does not pay for them.


@click.group()
def record() -> None:
    """Record a real vLLM engine, step by step, in shared/data/vllm_cpu's format.

    \b
    A live server (vLLM's own interpreter, latroute's root on PYTHONPATH):
      PYTHONPATH=/path/to/latroute LATROUTE_RECORD_DIR=rec \\
        python -m vllm.entrypoints.openai.api_server --model DIR ... \\
        --scheduler-cls traces.vllm_recorder.scheduler.RecordingScheduler
    Then `latroute trace import vllm-record rec --out T`.
    """


@record.command("engine")
@click.argument("trace_dir", metavar="TRACE", type=click.Path(path_type=Path))
@click.option("--model", required=True, type=click.Path(path_type=Path), help="Model directory (config.json).")
@click.option("--model-name", help="Name recorded as the model and instance (default: the directory's name).")
@click.option("--out", required=True, type=click.Path(path_type=Path), help="Recording directory to create.")
@click.option("--vllm-python", help="vLLM's interpreter (default: $LATROUTE_VLLM_PYTHON).")
@click.option("--max-num-batched-tokens", type=TOKENS, default=512, show_default=True,
              help="vLLM's token budget per step.")
@click.option("--max-num-seqs", type=IntIn(1, 10**6), default=64, show_default=True,
              help="vLLM's cap on requests per step.")
@click.option("--long-prefill-token-threshold", type=IntIn(0, 10**7), default=0, show_default=True,
              help="vLLM's cap on one prefill chunk when several requests prefill (0: off).")
@click.option("--prefix-caching/--no-prefix-caching", default=True, show_default=True,
              help="vLLM's enable_prefix_caching.")
@click.option("--num-kv-blocks", type=IntIn(1, 2**31 - 1), help="num_gpu_blocks_override (default: from memory).")
@click.option("--gpu-memory-utilization", type=Finite(0.0, 1.0, min_open=True), default=0.2, show_default=True,
              help="Share of memory (RAM on CPU) vLLM reserves for the KV cache.")
@click.option("--max-model-len", type=TOKENS, default=4096, show_default=True,
              help="vLLM's max_model_len: prompt + output tokens of one request.")
@click.option("--dtype", default="float32", show_default=True,
              help="Model dtype (float32: bfloat16 is slow on these CPUs).")
@click.option("--hash-block-tokens", type=IntIn(1, 2**20), help="Tokens per hash_ids block (default: meta.json).")
@click.option("--seed", type=SEED, default=0, show_default=True, help="Seed of the prompt tokens and of vLLM.")
@click.option("--warmup", type=IntIn(0, 10**6), default=2, show_default=True,
              help="Requests run before the recording starts (not recorded).")
@click.option("--omp-threads-bind", help="VLLM_CPU_OMP_THREADS_BIND for the engine (e.g. 0: one thread on core 0).")
@click.option("--time-limit", type=POSITIVE, default=3600.0, show_default=True,
              help="Seconds of replay after which the run is abandoned (exit 1).")
@click.option("--force", is_flag=True, help="Replace --out if it exists.")
def engine(trace_dir: Path, model: Path, model_name: str | None, out: Path, **kw) -> None:
    """Replay TRACE open loop through an in-process vLLM engine and record it.

    Arrival times, exact prompt and output lengths (ignore_eos, max_tokens)
    and hash_ids (identical token blocks for identical ids, unique tokens
    elsewhere) come from TRACE; requests are handed to the engine between
    steps, as a serving front end does. The recording imports with
    `latroute trace import vllm-record`. vLLM releases 0.19.0 to 0.32.x are
    recorded; another is refused by name before the engine starts (exit 2),
    as latroute does not model its scheduling rules.

    \b
    Example:
      latroute record engine d1 --model ../shared/models/tiny-a --no-prefix-caching --out rec-d1
      latroute trace import vllm-record rec-d1 --out rec-d1.trace
    """
    from traces.files.outputs import check_out

    check_out(out, kw["force"], inputs=[trace_dir, model])  # before any work
    from harness.live.record import EngineOptions, RunFailed, record_engine, vllm_python
    from traces.store import open_trace

    python = vllm_python(kw.pop("vllm_python"))
    opts = EngineOptions(model=model, model_name=model_name, max_num_batched_tokens=kw["max_num_batched_tokens"],
                         max_num_seqs=kw["max_num_seqs"], long_prefill_token_threshold=kw["long_prefill_token_threshold"],
                         enable_prefix_caching=kw["prefix_caching"], num_kv_blocks=kw["num_kv_blocks"],
                         gpu_memory_utilization=kw["gpu_memory_utilization"], max_model_len=kw["max_model_len"],
                         dtype=kw["dtype"], seed=kw["seed"],
                         extra_env={"VLLM_CPU_OMP_THREADS_BIND": kw["omp_threads_bind"]} if kw["omp_threads_bind"] else {})
    trace = open_trace(trace_dir)
    try:
        s = record_engine(trace, opts, out, python, hash_block_tokens=kw["hash_block_tokens"], prompt_seed=kw["seed"],
                          warmup=kw["warmup"], time_limit_s=kw["time_limit"], force=kw["force"])
    except RunFailed as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(1)
    us = s["recorder_us_per_step"]
    click.echo(f"recorded {s['requests']} requests in {s['steps']:,} steps ({s['step_ms_mean']:.2f} ms per step); "
               f"recorder {us['mean']:.1f} µs per step (p99 {us['p99']:.1f} µs) = "
               f"{100 * s['recorder_share_of_step_time']:.2f}% of step time")
    click.echo(f"wrote {out}")


@record.command("finish")
@click.argument("recording", metavar="DIR", type=click.Path(path_type=Path))
def finish_cmd(recording: Path) -> None:
    """Join the rotated parts of a recording whose server was killed.

    A recording server joins its parts into steps.jsonl and requests.csv
    when it shuts down; after a crash, this does it. A part that is a link,
    a FIFO, a device or a directory, is not UTF-8, or holds a malformed line
    (a row whose field count differs from its header, headers that differ
    between parts) is refused naming its row, exit 2, nothing removed; the
    parts are removed only once the joined files are written and read back.
    """
    from harness.live.record import finish

    done = finish(recording)
    click.echo(f"joined {done['step_parts']} step parts and {done['request_parts']} request parts in {recording}")
