"""The event queue batches a replica pool's instances in one compiled
call, and says so when it cannot for any reason but differing types.

Why: the per-instance fallback gives the same bytes, so a fleet that
silently lost its compiled loop (a Numba cache index naming a module that
moved fails to unpickle on every call, numba/numba#6018) was only seen as
a replay about 1.6x slower on sfs-cc. The digest tests cannot see it.
"""
from __future__ import annotations

from types import SimpleNamespace

from numba.core.errors import TypingError

from tests.harness.twin.loop.test_fleet_loop import toy_requests, toy_specs


def _fake(n: int) -> list:
    return [SimpleNamespace(state=k, plan=k, tw=k, model=k, log=k) for k in range(n)]


def test_a_replica_pool_runs_in_one_compiled_call(monkeypatch) -> None:
    """Three instances of one configuration: the queue holds their bundles
    in one typed list (not the per-instance fallback)."""
    import harness.twin.event_queue as eq
    from harness.twin.simulation import Twin, TwinConfig

    made = []
    real = eq._bundles
    monkeypatch.setattr(eq, "_bundles", lambda insts: made.append(real(insts)) or made[-1])
    Twin(toy_specs(3), TwinConfig(seed=1), fleet_loop=True).run(toy_requests(40, 50.0, 2), lambda i, t, views: i % 3)
    assert made and all(b is not None and len(b) == 3 for b in made)


def test_an_unreadable_compiled_loop_warns_once_and_falls_back(monkeypatch, capsys) -> None:
    import harness.twin.event_queue as eq

    def stale(first):
        raise ModuleNotFoundError("No module named 'harness.twin.loop_parts'")

    monkeypatch.setattr(eq, "new_list", stale)
    monkeypatch.setattr(eq, "_WARNED", [])
    assert eq._bundles(_fake(3)) is None
    assert eq._bundles(_fake(3)) is None
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("warning: the fleet's compiled loop did not load")
    assert "harness.twin.loop_parts" in err[0]


def test_differing_types_fall_back_quietly(monkeypatch, capsys) -> None:
    import harness.twin.event_queue as eq

    def differ(bl, b):
        raise TypingError("no common type")

    monkeypatch.setattr(eq, "new_list", lambda first: [first])
    monkeypatch.setattr(eq, "append_item", differ)
    monkeypatch.setattr(eq, "_WARNED", [])
    assert eq._bundles(_fake(2)) is None
    assert capsys.readouterr().err == ""
