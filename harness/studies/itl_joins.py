"""What a joining request costs the running ones, from a vllm-bench trace's
ITLs and from the twin's replay of it (docs/results/request-level.md: why
no engine intake is charged on the A100 host):

    latroute study itl-joins TRACE PROFILE.json [--prefix-cache warm|cold]

TRACE: `latroute trace import vllm-bench` output (with requests.itls_s);
PROFILE: `calibrate --from-requests` output. Prints, for the measured ITLs
and for the twin's steps, the least-squares fit ITL ~ c0 + c_any*[joins>0]
+ c_join*joins + c_run*running + c_tok*joiners' prompt tokens.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from estimators.timemodel.profile import load_profile
from harness.requestlevel.engine_options import parse_engine_options, request_engine
from harness.requestlevel.frontend import FrontEnd
from harness.requestlevel.validate import RequestTrace, replay_requests
from traces.store import open_trace


def fit(itl, joins, running, tokens):
    keep = itl <= np.percentile(itl, 99.5)
    X = np.column_stack([np.ones(len(itl)), joins > 0, joins, running, tokens])[keep]
    y = itl[keep]
    coef, *_ = np.linalg.lstsq(X, y, rcond=None)
    r = y - X @ coef
    se = np.sqrt(np.diag(np.linalg.pinv(X.T @ X)) * float(r @ r) / max(len(y) - X.shape[1], 1))
    return coef, se


def measured(reqs):
    r = reqs[reqs["itls_s"].notna()]
    first = (r["arrival_s"] + r["ttft_s"]).to_numpy()
    itls = [np.asarray(x, dtype=float) for x in r["itls_s"]]
    last = np.sort([f + x.sum() for f, x in zip(first, itls)])
    order = np.argsort(first)
    fs = first[order]
    pcum = np.concatenate(([0.0], np.cumsum(r["prompt_tokens"].to_numpy(dtype=float)[order])))
    start = np.concatenate([f + np.cumsum(x) - x for f, x in zip(first, itls)])
    itl = np.concatenate(itls)
    lo, hi = np.searchsorted(fs, start, "right"), np.searchsorted(fs, start + itl, "right")
    running = lo - np.searchsorted(last, start + itl, "left")
    return fit(itl, hi - lo, running, pcum[hi] - pcum[lo])


def twin(rt, path):
    doc = json.load(open(path))
    rf = doc["fitted_on"]["request_fit"]
    eng = request_engine(None, parse_engine_options(tuple(f"{k}={v}" for k, v in doc["fitted_on"]["engine"].items()
                                                          if k in ("max_num_batched_tokens", "max_num_seqs"))))
    res = replay_requests(rt, load_profile(path), eng, rf["frontend_overhead_s"], record_steps=True,
                          frontend=FrontEnd.from_json(rf.get("frontend")))
    st = res.steps[res.steps["start_s"] >= res.extra.get("time_shift_s", 0.0)].sort_values("step")
    it = res.step_items[res.step_items["step"].isin(st["step"])]
    b, t, p = (it[c].to_numpy() for c in ("computed_before", "tokens", "prompt_tokens"))
    first, dec = (b < p) & (b + t >= p), b >= p
    per = it.assign(j=first, d=dec, tok=np.where(first, p, 0)).groupby("step")[["j", "d", "tok"]].sum()
    d = st.set_index("step").join(per).fillna(0)
    itl = d["end_s"].diff().to_numpy()
    ok = np.isfinite(itl) & (d["d"].to_numpy() > 0)
    return fit(itl[ok], d["j"].to_numpy()[ok], d["d"].to_numpy()[ok], d["tok"].to_numpy()[ok])


def study(trace: Path, profile: Path, prefix_cache: str) -> None:
    """Print both fits, the measured ITLs' and the twin's steps'."""
    rt = RequestTrace.of(open_trace(trace)).warmed(prefix_cache)
    for name, (c, se) in (("measured ITLs", measured(rt.requests)), ("twin steps", twin(rt, profile))):
        print(f"{name:<14} per join {1e3 * c[2]:.2f} ± {1e3 * se[2]:.2f} ms, any join {1e3 * c[1]:+.2f} ms, "
              f"per running {1e3 * c[3]:.3f} ms, per joiner prompt token {1e6 * c[4]:+.2f} us")
