"""What a workload trace tells a router about each request, as the headers
``latroute route`` reads (``loadgen --route-fields``): the TTFT SLO
(``slo_ttft_s``), the predicted output length (``predicted_output_tokens``)
and every model's predicted accuracy (the quality table's ``acc_hat``).

Why: a live study compares the proxy's routers with an offline replay of
the same trace; if the proxy drew its own SLOs and accuracies (its
policies draw per request in arrival order, the replay's per trace), the
two would route different workloads. With these headers both see the same
inputs, and only the engines differ. A column the trace lacks is simply not
sent (the proxy's policy then decides, as it says in its log).
"""
from __future__ import annotations

import numpy as np

from harness.route.inputs import request_headers
from traces.errors import BadInput
from traces.store import Trace


def route_fields(trace: Trace, request_ids: np.ndarray) -> tuple[dict[str, str], ...]:
    """One header dict per request of ``request_ids`` (in that order)."""
    cols = trace.columns("requests")
    want = [c for c in ("slo_ttft_s", "predicted_output_tokens") if c in cols]
    reqs = trace.read("requests", ["request_id", *want]).set_index("request_id")
    quality: dict[int, dict[str, float]] = {}
    if trace.has("quality"):
        q = trace.read("quality", ["request_id", "model", "acc_hat"])
        for rid, model, hat in zip(q["request_id"].to_numpy().tolist(), q["model"].astype(str).tolist(),
                                   q["acc_hat"].to_numpy(dtype=np.float64).tolist(), strict=True):
            quality.setdefault(int(rid), {})[model] = hat
    if not want and not quality:
        raise BadInput(trace.file("requests"), None, "slo_ttft_s",
                       "--route-fields: the trace has no slo_ttft_s, predicted_output_tokens or quality table")
    out = []
    for rid in np.asarray(request_ids).tolist():
        row = reqs.loc[rid] if want else None
        slo = float(row["slo_ttft_s"]) if "slo_ttft_s" in want and np.isfinite(row["slo_ttft_s"]) else None
        pred = row.get("predicted_output_tokens") if row is not None else None
        pred = int(pred) if pred is not None and np.isfinite(pred) else None
        out.append(request_headers(slo, quality.get(int(rid)), pred))
    return tuple(out)
