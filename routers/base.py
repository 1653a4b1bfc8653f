"""The router interface and registry.

A router is called by the twin at each arrival as ``router(i, t, insts)``
and returns an instance index. It sees only honest views of the instances
(``estimators.engine.view.InstanceView``: state after the last completed
step, the in-flight step's start and composition, arrivals not yet
scheduled, each resident's progress through ``resident_progress``) and the
query's own predicted quantities; never true output lengths or step end
times. Routers import no harness and no engine module (``lint-imports``).

The views hold no more than that, whatever a router reads: the twin hands
routers ``harness.twin.views.honest.HonestView`` objects that keep no
reference to the instance (a plug-in that walks every attribute and array
finds no true length and no step end: ``tests/harness/twin/views/test_views_hide_the_truth.py``).
The one explicit path to the truth is ``oracle``: a router whose class (or
registry entry) says ``oracle = True`` is handed the live instances, which
offer ``ClairvoyantView``; results record it as an oracle.

A router may also *shed* a request -- decline it before any instance sees
it, as llm-d's admitters do (``routers.llmd_admit``) -- by returning
``SHED``; the twin takes that answer only from a router whose class says
``sheds = True`` (any other router answering it is a bug, refused). A shed
request is served nowhere: utility 0 and an SLO miss in every metric.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from routers.utility import ByInstance

SHED = -1  # a router's answer: the request is declined, no instance serves it (only routers with sheds = True)


@runtime_checkable
class ClairvoyantView(Protocol):
    """What the twin's live instances offer beyond an honest view, for the
    ``oracle`` router only: a fork of the instance's true future."""

    max_model_len: int

    @property
    def residents(self) -> int: ...

    def true_first_token(self, rid: int, prompt: int, output: int, t: float, until: float) -> float:
        """First-token time of ``rid`` added at ``t`` with its true output
        length, on a fork of the instance, if by ``until``; else NaN."""
        ...


@dataclass
class RouteInputs:
    """Per-query data a router may use (all predicted, none realised)."""

    prompt: np.ndarray  # (N,)
    slo: np.ndarray  # (N,) TTFT SLO tau_i, seconds
    utility: np.ndarray | ByInstance  # (N, J) predicted utility (replicas share a column: ByInstance)
    pred_total: np.ndarray  # (N,) predicted output length (for residents' remaining work)

    def __post_init__(self) -> None:
        """Own copies: an array taken from a DataFrame column is often a view
        of a block holding other columns too (``output_tokens``!), reachable
        through its ``base``."""
        for name in ("prompt", "slo", "pred_total"):
            setattr(self, name, np.array(getattr(self, name)))
        u = self.utility
        self.utility = u.copy() if isinstance(u, ByInstance) else np.array(u)  # replicas: a column per model


class Router:
    """Base class: times every decision."""

    name = "router"
    oracle = False  # True: handed the live instances (ClairvoyantView), recorded as an oracle
    sheds = False  # True: may answer SHED (decline the request) instead of an instance index
    # "residents": reads nothing of its views but ``views.residents`` (the twin may then leave the views' other
    # fields as they were until the run's end, saving their refresh at every decision); "indexed": reads views
    # only one at a time, as ``views[k]`` (the twin may then bring a view to the present when it is read, and
    # leave the instances nobody reads in their steady runs); "views": anything
    reads = "views"

    def __init__(self, inputs: RouteInputs):
        self.inputs = inputs
        self.decision_ns = 0
        self.decisions = 0

    def __call__(self, i: int, t: float, insts) -> int:
        t0 = time.perf_counter_ns()
        j = self.choose(i, t, insts)
        self.decision_ns += time.perf_counter_ns() - t0
        self.decisions += 1
        return j

    def choose(self, i: int, t: float, insts) -> int:  # pragma: no cover - interface
        raise NotImplementedError

    @property
    def mean_decision_us(self) -> float:
        return self.decision_ns / self.decisions / 1e3 if self.decisions else float("nan")
