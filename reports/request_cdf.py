"""Measured vs twin TTFT CDFs, one panel per request-level trace.

Reads the ``requests.parquet`` that ``validate`` writes for a request-level
trace (``ttft_true_s``, ``ttft_twin_s``) and draws both empirical CDFs, so
a reader sees where the twin's distribution departs from the measured one
(the KS statistic is the largest vertical gap).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd


def ttft_cdf_figure(validations: dict[str, Path], out: Path) -> Path:
    """One panel per ``{label: validate output dir}``; writes ``out`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(validations)
    fig, axes = plt.subplots(1, n, figsize=(3.6 * n, 3.0), squeeze=False)
    for ax, (label, d) in zip(axes[0], validations.items()):
        per = pd.read_parquet(Path(d) / "requests.parquet")
        for col, name, style in (("ttft_true_s", "measured", "-"), ("ttft_twin_s", "twin", "--")):
            v = np.sort(per[col].to_numpy(dtype=np.float64))
            v = v[np.isfinite(v)]
            ax.step(1e3 * v, np.arange(1, v.size + 1) / v.size, style, where="post", label=name)
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("TTFT (ms)")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("fraction of requests")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
