"""Replaying a trace whose arrivals are unknown: ``replay`` and
``sweep --trace`` ended in a traceback from the twin; now one line naming
the first unknown row, before any work."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tests.support.clean_refusal import refused_cleanly
from traces.store import TraceWriter


def _trace(path, arrivals):
    with TraceWriter(path) as w:
        w.meta["source"] = {"kind": "test"}
        w.write_table("requests", pd.DataFrame({"request_id": np.arange(len(arrivals)), "arrival_s": arrivals,
                                                "prompt_tokens": [100] * len(arrivals),
                                                "output_tokens": [5] * len(arrivals)}))


@pytest.mark.parametrize("arrivals,row", [([np.nan] * 4, 1), ([0.0, 1.0, np.nan, 3.0], 3)])
@pytest.mark.parametrize("command", [["replay", "--router", "shortest-queue"],
                                     ["sweep", "--rates", "4", "--routers", "shortest-queue", "--workers", "1"]])
def test_unknown_arrivals_are_refused_before_replaying(tmp_path, command, arrivals, row):
    _trace(tmp_path / "t", arrivals)
    refused_cleanly([*command, "--trace", tmp_path / "t", "--out", tmp_path / "o"], [tmp_path],
                    f"requests.parquet:{row}: arrival_s", "unknown")
