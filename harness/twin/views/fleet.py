"""``FleetViews``: the views the twin hands a (non-oracle) router, as a
list of ``HonestView`` plus per-instance arrays a fleet router reads
without walking every view.

Why: at hundreds of instances a decision that reads one number per view
(shortest-queue's residents) costs more in Python attribute walks than in
arithmetic; ``residents`` holds the same numbers in one int64 array, kept
current by the twin as it refreshes the views of instances that changed.
``model_of`` is each instance's model index (models numbered in order of
first appearance), fixed for the run. The arrays are for reading: a router
that writes them corrupts only its own later decisions' inputs, never the
twin. Like the views, the object holds no reference to a live instance.
"""
from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from harness.twin.views.honest import NH, HonestView


class FleetViews(list):
    """A list of ``HonestView`` (index ``k`` is instance ``k``) with
    ``residents`` and ``model_of`` arrays, the shared ``clock`` and the
    views' honest scalars ``h`` (row ``k`` is view ``k``'s)."""

    def __init__(self, views: Iterable[HonestView], models: list[str], clock: np.ndarray):
        super().__init__(views)
        if len(models) != len(self):
            raise ValueError(f"{len(models)} models for {len(self)} views")
        index: dict[str, int] = {}
        self.model_of = np.array([index.setdefault(m, len(index)) for m in models], dtype=np.int64)
        self.residents = np.zeros(len(self), dtype=np.int64)
        self.clock = clock
        self.h = np.array([v.h for v in self], dtype=np.float64).reshape(len(self), NH)
        for k, v in enumerate(self):
            v.h = self.h[k]  # each view's honest scalars are a row here, refreshed for many views in one call
            v.res, v.ri = self.residents, k

    def refresh(self, insts, changed: Iterable[int]) -> None:
        """Bring the views of the ``changed`` instances to the present
        (``Instance.sync_view``) and their entries in ``residents``."""
        for k in changed:
            insts[k].sync_view()


class IndexedFleetViews(FleetViews):
    """``FleetViews`` for a router that reads views one at a time
    (``Router.reads == "indexed"``): ``views[k]`` first calls ``bring(k)``,
    which the twin's lazy loop sets to bring instance ``k`` and its view to
    the present (``EventQueue.bring``); iterating brings every view. Why:
    a router that estimates one replica or two per decision need not have
    every changed view refreshed, nor every instance's steps run, before
    it decides. With ``bring`` None it is a ``FleetViews``."""

    bring = None

    def __getitem__(self, k):
        bring = self.bring
        if bring is not None:
            if isinstance(k, slice):
                for q in range(*k.indices(len(self))):
                    bring(q)
            else:
                bring(k if k >= 0 else k + len(self))
        return list.__getitem__(self, k)

    def __iter__(self):
        for k in range(len(self)):
            yield self[k]
