"""``latroute study NAME``: the studies whose tables the results pages show, one subcommand each.

Each subcommand is a thin wrapper over a module of ``harness.studies``, imported where the study
runs, so that ``latroute study NAME --help`` loads none of the numeric stack. A new study adds a
function here (its options and a lazy import) and a module under ``harness/studies/``.
"""
from __future__ import annotations

from pathlib import Path

import click

from harness.cli.params import refuse_non_utf8

GPU_RUNS = Path("../shared/data/vllm_gpu_llmservingsim")


@click.group()
def study() -> None:
    """Run a study and write the tables its results page shows.

    \b
    Examples:
      latroute study gpu-fidelity --out gpu-fidelity   # docs/results/gpu-fidelity.md
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
