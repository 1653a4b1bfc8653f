"""``latroute study NAME``: the studies whose tables the results pages show, one subcommand each.

Each subcommand is a thin wrapper over a module of ``harness.studies``, imported where the study
runs, so that ``latroute study NAME --help`` loads none of the numeric stack. A new study adds a
function here (its options and a lazy import) and a module under ``harness/studies/``.
"""
from __future__ import annotations

from pathlib import Path

import click

from harness.cli.params import IntIn, refuse_non_utf8

GPU_RUNS = Path("../shared/data/vllm_gpu_llmservingsim")


@click.group()
def study() -> None:
    """Run a study and write the tables its results page shows.

    \b
    Examples:
      latroute study gpu-fidelity --out gpu-fidelity   # docs/results/gpu-fidelity.md
      latroute study lmbench-h100 --out lmbench        # docs/results/lmbench-h100.md
    """


@study.command("gpu-fidelity")
@click.option("--data", type=click.Path(path_type=Path, file_okay=False), default=GPU_RUNS, show_default=True,
              help="The two vLLM GPU runs (RTX4090_Llama-3.1-8B, RTXPRO6000_Qwen3-32B), as shared.")
@click.option("--out", required=True, type=click.Path(path_type=Path, file_okay=False),
              help="Directory for results.json, tables.md, the imported traces and the fitted profiles.")
@click.option("--variant", "variants", multiple=True, metavar="NAME",
              help="Run only this variant of the fit (repeatable; default: every variant, the page's table).")
def gpu_fidelity(data: Path, out: Path, variants: tuple[str, ...]) -> None:
    """Fit each GPU run's first 50% and first 30% of timings; score the second half.

    Every variant of the request-level fit is also scored on the fit window alone (fitted on its first
    two thirds, scored on its last third); the variant with the smallest error there is the page's.
    """
    refuse_non_utf8({"--data": data, "--out": out})
    from harness.studies import gpu_fidelity as g
    from traces.errors import BadOption

    known = {v.name: v for v in g.VARIANTS}
    unknown = [v for v in variants if v not in known]
    if unknown:
        raise BadOption("--variant", f"{unknown[0]!r} is not one of: {', '.join(known)}")
    if not (data / g.RUNS[0][1]).is_dir():
        raise BadOption("--data", f"{data} has no {g.RUNS[0][1]} (the shared vllm_gpu_llmservingsim folder)")
    out.mkdir(parents=True, exist_ok=True)
    g.study(data, out, tuple(known[v] for v in variants) or g.VARIANTS, echo=click.echo)


LMBENCH = Path("../shared/data/llmd_lmbench_per_request")


@study.command("lmbench-h100")
@click.option("--data", type=click.Path(path_type=Path, file_okay=False), default=LMBENCH, show_default=True,
              help="llm-d-benchmark's LMBench per-request logs (per_request.csv and runs.csv), as shared.")
@click.option("--out", required=True, type=click.Path(path_type=Path, file_okay=False),
              help="Directory for results.json, tables.md, commands.log, the imported traces, profiles and results "
                   "(kept: a rerun reuses what is there).")
@click.option("--assign-seeds", "seeds", type=IntIn(1, 100), default=5, show_default=True,
              help="Seeds of each assignment of requests to replicas (and of the routers' replays).")
@click.option("--group", "groups", multiple=True, type=click.Choice(["sharegpt", "short_input", "exp4"]),
              help="Run only this group of runs (repeatable; default: all three and the routing question).")
def lmbench_h100(data: Path, out: Path, seeds: int, groups: tuple[str, ...]) -> None:
    """Calibrate, validate and score the H100 LMBench fleets; compare their routing.

    \b
    A fleet fit of the vLLM round-robin deployment (2 replicas) from its 4/8/12 q/s
    sharegpt runs, validated on every other run (active replicas, assignment seeds),
    estimate MAPE per rate, and the three stacks on the requests all three logged
    beside the twin's routers; the short_input runs fitted on their own 0.5-1.5 q/s
    runs; exp-4's Llama-4-Scout runs (docs/results/lmbench-h100.md).
    """
    refuse_non_utf8({"--data": data, "--out": out})
    from traces.errors import BadOption

    for name in ("per_request.csv", "runs.csv"):
        if not (data / name).is_file():
            raise BadOption("--data", f"{data} has no {name} (the shared llmd_lmbench_per_request folder)")
    from harness.studies import lmbench_h100 as s

    try:
        s.study(data, out, seeds, groups, routing=not groups or "sharegpt" in groups, echo=click.echo)
    except s.StudyError as e:
        raise click.ClickException(str(e)) from None
