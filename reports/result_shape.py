"""The shape of a result directory as ``report`` reads it, checked where it
enters.

The figures and tables index a result's metrics.json and its tables freely
(``m["estimators"].items()``, ``v["router"]``, ``df["rate"].max()``); a
result whose metrics hold a string where an object belongs, a list, a
missing key, a 400-digit integer or a table column of the wrong type would
make them fail half-way through a report with a traceback. Every value a
report reads is checked here first, against what ``estimate``,
``validate``, ``replay`` and ``sweep`` write, and a mismatch is refused in
the one error line naming the file, the row (tables) and the dotted key.
Values the report does not read are not judged.

Limits: every number in a metrics.json and every numeric table cell has a
magnitude of at most ``NUM_MAX`` (2^63; beyond it a float sum or a format
overflows); strings are valid Unicode (a lone surrogate cannot be written
to the report); a table has at least one row.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd

from reports.results import Result, load_result
from traces.errors import BadInput

NUM_MAX = 2.0 ** 63
NULL = object()  # a marker: the value may be null (NaN when written)
SERVING_NUMBERS = ("request_throughput", "output_throughput", "total_token_throughput", "completed", "duration_s")


def _type(v: Any) -> str:
    return "null" if v is None else {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}.get(
        type(v), type(v).__name__)


class _Doc:
    """Typed reads of one metrics.json, each failure naming file and key."""

    def __init__(self, file: Path):
        self.file = file

    def fail(self, where: str, reason: str) -> BadInput:
        return BadInput(self.file, None, where, reason)

    def obj(self, v: Any, where: str, null: bool = False) -> dict:
        if v is None and null:
            return {}
        if not isinstance(v, dict):
            raise self.fail(where, f"expected an object, got {_type(v)}")
        return v

    def num(self, v: Any, where: str, null: bool = True) -> float | None:
        if v is None and null:
            return None
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise self.fail(where, f"expected a number, got {_type(v)}")
        if abs(v) > NUM_MAX:
            shown = f"an integer of {len(str(abs(v)))} digits" if isinstance(v, int) else f"{v:g}"
            raise self.fail(where, f"{shown} is beyond +-2^63, not a value a result holds")
        return float(v)

    def text(self, v: Any, where: str) -> str:
        if not isinstance(v, str):
            raise self.fail(where, f"expected a string, got {_type(v)}")
        return v

    def walk(self, v: Any, where: str = "metrics.json") -> None:
        """Every number within bounds, every string and key valid Unicode."""
        stack = [(v, where)]
        while stack:
            x, w = stack.pop()
            if isinstance(x, dict):
                for k, y in x.items():
                    self._unicode(k, w)
                    stack.append((y, f"{w}.{k}" if w != "metrics.json" else k))
            elif isinstance(x, list):
                stack.extend((y, f"{w}[{i}]") for i, y in enumerate(x))
            elif isinstance(x, str):
                self._unicode(x, w)
            elif isinstance(x, (int, float)) and not isinstance(x, bool):
                self.num(x, w)

    def _unicode(self, s: str, where: str) -> None:
        try:
            s.encode("utf-8")
        except UnicodeEncodeError:
            raise self.fail(where, "holds a lone surrogate (\\ud800-\\udfff), not Unicode text") from None

    def numbers(self, d: dict, keys, where: str) -> None:
        for k in keys:
            self.num(d.get(k), f"{where}.{k}" if where else k)

    def bins(self, v: Any, where: str) -> None:
        """``{bin: {"mape": number}}`` (by_load, by_cached_share)."""
        for k, b in self.obj(v, where, null=True).items():
            self.num(self.obj(b, f"{where}.{k}", null=True).get("mape"), f"{where}.{k}.mape")

    def serving(self, v: Any, where: str) -> None:
        """One run's serving metrics (reports.serving): latency stats in ms,
        throughputs, goodput."""
        s = self.obj(v, where, null=True)
        for k, x in s.items():
            if k.endswith("_ms"):
                for stat, y in self.obj(x, f"{where}.{k}", null=True).items():
                    self.num(y, f"{where}.{k}.{stat}")
                    if stat.startswith("p"):
                        try:
                            p = float(stat[1:])
                        except ValueError:
                            p = math.nan
                        if not 0 < p <= 100:
                            raise self.fail(f"{where}.{k}.{stat}", "not a percentile name (p50, p99.9, ...)")
        self.numbers(s, [k for k in SERVING_NUMBERS if k in s], where)
        self.num(self.obj(s.get("goodput"), f"{where}.goodput", null=True).get("request_goodput"),
                 f"{where}.goodput.request_goodput")


def _estimate(d: _Doc, m: dict) -> None:
    if "estimators" not in m:
        raise d.fail("estimators", "missing (an estimate result has per-estimator metrics)")
    for name, s in d.obj(m["estimators"], "estimators").items():
        w = f"estimators.{name}"
        s = d.obj(s, w)
        d.numbers(s, ("n", "mape", "median_ape", "p90_ape", "p99_ape", "median_us"), w)
        d.bins(s.get("by_load"), f"{w}.by_load")
        d.bins(s.get("by_cached_share"), f"{w}.by_cached_share")


def _validate(d: _Doc, m: dict) -> None:
    if "ttft" not in m:
        raise d.fail("ttft", "missing (a validate result has TTFT metrics)")
    t = d.obj(m["ttft"], "ttft")
    d.numbers(t, ("n", "mape", "median_ape", "p90_ape", "p99_ape"), "ttft")
    d.bins(t.get("by_cached_share"), "ttft.by_cached_share")
    for run, s in d.obj(m.get("serving"), "serving", null=True).items():
        d.serving(s, f"serving.{run}")


def _replay(d: _Doc, m: dict) -> None:
    for k in ("ontime_utility", "slo_attainment", "ttft_mean_s", "ttft_p90_s"):
        if k not in m:
            raise d.fail(k, "missing (a replay result has it)")
        d.num(m[k], k)
    if "router" in m:
        d.text(m["router"], "router")
    d.num(m.get("rate"), "rate")
    for inst, v in d.obj(m.get("share_by_instance"), "share_by_instance", null=True).items():
        d.num(v, f"share_by_instance.{inst}", null=False)
    for task, shares in d.obj(m.get("share_by_task"), "share_by_task", null=True).items():
        for inst, v in d.obj(shares, f"share_by_task.{task}").items():
            d.num(v, f"share_by_task.{task}.{inst}", null=False)
    d.serving(m.get("serving"), "serving")


def _sweep(d: _Doc, m: dict) -> None:
    if "routers" not in m:
        raise d.fail("routers", "missing (a sweep result has per-router metrics)")
    for key, v in d.obj(m["routers"], "routers").items():
        w = f"routers.{key}"
        v = d.obj(v, w)
        if "router" not in v:
            raise d.fail(f"{w}.router", "missing")
        d.text(v["router"], f"{w}.router")
        d.num(v.get("delta_per_us", 0.0), f"{w}.delta_per_us", null=False)
        d.numbers(v, ("lambda", "auc_ontime_utility", "auc_ratio_to_best_baseline"), w)
        for rate, b in d.obj(v.get("by_rate"), f"{w}.by_rate", null=True).items():
            try:
                ok = math.isfinite(float(rate))
            except ValueError:
                ok = False
            if not ok:
                raise d.fail(f"{w}.by_rate.{rate}", "not a rate (a finite number of q/s)")
            d.numbers(d.obj(b, f"{w}.by_rate.{rate}"), ("ontime_utility", "slo_attainment", "ttft_mean_s"),
                      f"{w}.by_rate.{rate}")
    for name, c in d.obj(m.get("router_capabilities"), "router_capabilities", null=True).items():
        d.obj(c, f"router_capabilities.{name}")
    if "rate_range" in m:
        rr = m["rate_range"]
        if not isinstance(rr, list) or len(rr) != 2:
            raise d.fail("rate_range", f"expected [low, high], got {_type(rr)}")
        for i, x in enumerate(rr):
            d.num(x, f"rate_range[{i}]", null=False)
    frontier = m.get("frontier", [])
    if not isinstance(frontier, list):
        raise d.fail("frontier", f"expected a list, got {_type(frontier)}")
    for i, p in enumerate(frontier):
        p = d.obj(p, f"frontier[{i}]")
        d.text(p.get("router"), f"frontier[{i}].router")
        for k in ("rate", "delta_per_us", "mean_utility", "ttft_mean_s"):
            d.num(p.get(k), f"frontier[{i}].{k}", null=False)


METRICS = {"estimate": _estimate, "validate": _validate, "replay": _replay, "sweep": _sweep}

# table -> (required numeric, optional numeric, required text, prefixes of optional numeric columns)
TABLES = {
    "results": (("rate", "delta_per_us", "ontime_utility", "slo_attainment"),
                ("lam", "seed", "mean_utility", "ttft_mean_s", "ttft_p90_s"), ("router",), ("share_", "serve_")),
    "estimates": (("est_s", "true_s"), ("p50_s", "p90_s", "p99_s"), ("estimator",), ()),
    "requests": ((), ("ttft_s", "slo_ttft_s", "ttft_true_s", "ttft_twin_s"), (), ()),
}
KEYS = ("rate", "delta_per_us", "lam", "seed")  # a sweep cell's parameters: never NaN


def check_table(file: Path, df: pd.DataFrame, table: str, kind: str) -> None:
    """The columns ``report`` reads from ``table``: present where required,
    numbers (finite, or NaN where a metric was not measured) or text."""
    need, opt, texts, prefixes = TABLES[table]
    if kind == "replay" and table == "requests":
        need = ("ttft_s",)
    if len(set(map(str, df.columns))) != len(df.columns):
        raise BadInput(file, None, table, "duplicate column names")
    if len(df) == 0 and table != "requests":
        raise BadInput(file, None, table, "has no rows")
    for col in (*need, *texts):
        if col not in df.columns:
            raise BadInput(file, None, col, "missing")
    numeric = list(need) + [c for c in df.columns if c in opt or (isinstance(c, str) and c.startswith(prefixes))]
    for col in dict.fromkeys(numeric):
        s = df[col]
        if s.dtype.kind not in "iuf":
            raise BadInput(file, None, col, f"expected numbers, got {s.dtype} values")
        v = s.to_numpy(dtype="float64")
        bad = ~(abs(v) <= NUM_MAX) & ~((v != v) & (col not in KEYS))  # NaN allowed only in measured values
        if bad.any():
            i = int(bad.argmax())
            raise BadInput(file, i + 1, col, f"{v[i]} is not a value this table holds")
    for col in texts:
        s = df[col]
        bad = ~s.map(lambda x: isinstance(x, str)).to_numpy()
        if bad.any():
            i = int(bad.argmax())
            raise BadInput(file, i + 1, col, f"expected text, got {_type(s.iloc[i])}")


TABLE_FILES = {"results": "results.parquet", "estimates": "estimates.parquet"}


def load_report_result(path: str | Path) -> Result:
    """``load_result`` with everything ``report`` reads checked."""
    path = Path(path)
    try:
        str(path).encode("utf-8")
    except UnicodeEncodeError:
        shown = str(path).encode("utf-8", "backslashreplace").decode("utf-8")
        raise BadInput(shown, None, "result", "the path is not valid UTF-8 (rename it)") from None
    r = load_result(path)
    d = _Doc(r.path / "metrics.json")
    d.walk(r.metrics)
    METRICS[r.kind](d, r.metrics)
    for table, df in r.tables.items():
        file = r.path / TABLE_FILES.get(table, "requests.parquet" if r.kind == "validate" else
                                        "served/requests.parquet")
        check_table(file, df, table, r.kind)
    return r
