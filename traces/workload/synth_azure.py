"""Writes large Azure-format CSV files for import benchmarks.

The real Azure 2023 traces are 9k-19k rows; importer memory must stay
bounded on sources of ten million rows and more, so ``latroute bench``
writes one of that size in this format (sorted timestamps, lognormal
token counts) and imports it.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

START = pd.Timestamp("2023-11-16 18:15:00")


def write_azure_csv(path: str | Path, rows: int, rate: float = 5.4, seed: int = 0,
                    chunk_rows: int = 1_000_000) -> None:
    rng = np.random.default_rng(seed)
    t = 0.0
    with open(path, "w", newline="") as f:
        f.write("TIMESTAMP,ContextTokens,GeneratedTokens\n")
        for lo in range(0, rows, chunk_rows):
            k = min(chunk_rows, rows - lo)
            times = t + np.cumsum(rng.exponential(1.0 / rate, k))
            t = float(times[-1])
            df = pd.DataFrame({
                "TIMESTAMP": START + pd.to_timedelta(np.round(times * 1e7).astype(np.int64) * 100, unit="ns"),
                "ContextTokens": np.clip(np.rint(rng.lognormal(np.log(1020), 1.0, k)), 1, 32000).astype(np.int64),
                "GeneratedTokens": np.clip(np.rint(rng.lognormal(np.log(129), 1.0, k)), 1, 4000).astype(np.int64),
            })
            df.to_csv(f, header=False, index=False, date_format="%Y-%m-%d %H:%M:%S.%f", lineterminator="\n")
