"""The pool-baseline disk cache (``harness.twin.baseline_cache``): an entry
is computed once and read back with the same numbers, bit for bit; a
different key, a corrupt entry or the cache turned off computes again; an
unwritable cache only costs time."""
from __future__ import annotations

import math
from dataclasses import asdict

import pytest

from estimators.estimate import BaselineParams
from harness.twin import baseline_cache as bc


@pytest.fixture
def counted(tmp_path, monkeypatch):
    monkeypatch.setenv("LATROUTE_CACHE_DIR", str(tmp_path / "cache"))
    calls = []

    def compute(value):
        def f():
            calls.append(1)
            return value
        return f
    return calls, compute, tmp_path / "cache"


TRICKY = {"a": 0.1 + 0.2, "b": 1e-300, "c": 2.0 ** -1074, "d": 123456789.123456789, "k": 3, "n": math.inf}


def test_computed_once_then_read_with_the_same_bits(counted):
    calls, compute, root = counted
    first = bc.cached_json("t", {"p": 1}, compute(TRICKY))
    again = bc.cached_json("t", {"p": 1}, compute({"a": -1.0}))
    assert len(calls) == 1 and again == first == TRICKY
    assert all(math.copysign(1, again[k]) == math.copysign(1, TRICKY[k]) and again[k].hex() == float(TRICKY[k]).hex()
               for k in ("a", "b", "c", "d")) and isinstance(again["k"], int)
    assert [p.name.endswith(".json") for p in (root / "t").iterdir()] == [True]  # no temporary file left


def test_other_key_corrupt_entry_and_off_compute_again(counted, monkeypatch):
    calls, compute, root = counted
    bc.cached_json("t", {"p": 1}, compute(1))
    assert bc.cached_json("t", {"p": 2}, compute(2)) == 2 and len(calls) == 2
    (entry,) = [p for p in (root / "t").iterdir() if p.name.startswith(bc.key_of({"p": 1}))]
    entry.write_text('{"value": ')  # a half-written file, as a kill mid-write would leave without the rename
    assert bc.cached_json("t", {"p": 1}, compute(3)) == 3 and len(calls) == 3
    monkeypatch.setenv("LATROUTE_CACHE_DIR", "off")
    assert bc.cache_dir() is None
    assert bc.cached_json("t", {"p": 1}, compute(4)) == 4 and len(calls) == 4


def test_unwritable_cache_still_answers(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("LATROUTE_CACHE_DIR", str(blocker / "cache"))
    assert bc.cached_json("t", [1], lambda: {"x": 1.5}) == {"x": 1.5}


def test_key_follows_the_code(monkeypatch):
    k = bc.key_of({"p": 1})
    monkeypatch.setattr(bc, "_code_digest", "0" * 64)
    assert bc.key_of({"p": 1}) != k


def test_baseline_params_round_trip_exactly(counted):
    p = BaselineParams(12345.678901234567, 0.0123456789, 7, 1.0 / 3.0, 0.7071067811865476, 5.999999999999999,
                       -0.001, 1e-7, -0.1234567890123, 0.3333333333333333)
    _, compute, _ = counted
    bc.cached_json("b", ["x"], compute({"i": asdict(p)}))
    back = BaselineParams(**bc.cached_json("b", ["x"], compute(None))["i"])
    assert back == p and type(back.lps_k) is int
