"""Two-level routing over replicas: the model first, then its replica.

Why: instances of one model (``InstanceSpec.model``) are *replicas*; their
predicted utility columns are equal, so a rule that walks instances by
utility with ties to the lowest index fills replica 0 to its SLO edge, then
replica 1, and so on. Production gateways choose the model, then
balance its replicas. Here level 1 walks the models by predicted utility
(ties: the lowest first index) and asks the rule's test (estimated TTFT
meets the SLO; P(on time) >= 1 - epsilon) of the model's *best* replica;
level 2 picks the replica by the tie policy:

- ``lowest-index``: the first replica meeting the test, in index order.
  Together with level 1 this is exactly the walk by (-utility, index) of
  the one-level rule, so results are byte-identical to it on every pool
  (queries in which two models tie exactly in utility walk the one-level
  order itself).
- ``least-latency``: every replica of the model is estimated; the lowest
  estimated TTFT among those meeting the SLO (chance rule: the highest
  P(on time), then the lowest estimate), ties to the lowest index.
- ``random``: the replicas in a random order (a generator seeded by the
  replay seed), the first meeting the test: the first qualifying element of
  a uniform permutation is uniform over the qualifying ones, so this is a
  uniform choice among them that still estimates lazily.

The default is ``random``: it
balances replicas as a gateway does at about one estimate per decision,
and on ``qwen3-h100-x8`` sfs-cc reaches 100.8% of the oracle's AUC with
it (least-latency 101.7%, lowest-index 85.7%; docs/results/fleet.md).

A *group* is the instances of one model whose utility columns are equal (a
pool whose replicas are priced differently splits into groups). With one
instance per group every policy walks the one-level order and estimates
the same instances: byte-identical to it (``tests/routers/test_fleet_routers.py``).
"""
from __future__ import annotations

import numpy as np

from routers.rules import hard_rule
from routers.utility import ByInstance

TIE_POLICIES = ("lowest-index", "least-latency", "random")
DEFAULT_TIES = "random"
UNIFORM_BLOCK = 4096
PRUNE_GATE = 0.8  # bound an instance whose last estimate or bound was at least this share of the SLO
PRECOMPUTE_LIMIT = 4_000_000  # queries x groups: above it the level-1 order is sorted per decision


def check_ties(ties: str) -> str:
    if ties not in TIE_POLICIES:
        raise ValueError(f"unknown tie policy {ties!r} (choose from {', '.join(TIE_POLICIES)})")
    return ties


class ModelGroups:
    """Groups of replicas and each query's level-1 order of them.

    ``members[g]``: the instances of group ``g`` in index order (groups
    numbered by their first instance). ``order(i)`` is query ``i``'s
    groups by (-utility, first index); ``tied(i)`` says whether two groups
    tie exactly in utility there (then the one-level walk interleaves their
    instances by index, and ``lowest-index`` walks it instead)."""

    def __init__(self, utility: np.ndarray | ByInstance, models: list[str]):
        if isinstance(utility, ByInstance):  # replicas point at a shared column: compare each column once
            table, cols = np.asarray(utility.table, dtype=np.float64), utility.cols
        else:
            table = np.asarray(utility, dtype=np.float64)
            cols = np.arange(table.shape[1] if table.ndim == 2 else len(models))
        n_inst = len(cols)
        if len(models) != n_inst:
            raise ValueError(f"{len(models)} models for {n_inst} utility columns")
        col_bytes: dict[int, bytes] = {}
        key_of: dict = {}
        group_of = np.zeros(n_inst, dtype=np.int64)
        members: list[list[int]] = []
        for j in range(n_inst):
            c = int(cols[j])
            if c not in col_bytes:
                col_bytes[c] = table[:, c].tobytes() if table.ndim == 2 else b""
            key = (models[j], col_bytes[c])
            g = key_of.setdefault(key, len(members))
            if g == len(members):
                members.append([])
            members[g].append(j)
            group_of[j] = g
        self.members = [np.array(m, dtype=np.int64) for m in members]
        self.member_lists = [list(m) for m in members]  # Python ints: the walk indexes arrays with them
        self.group_of = group_of
        self.first = np.array([m[0] for m in members], dtype=np.int64)
        self.singletons = all(len(m) == 1 for m in members)
        self.n_instances = n_inst
        self._u = table[:, cols[self.first]] if table.ndim == 2 else np.zeros((0, len(members)))
        self._nan = bool(np.isnan(table).any())
        self._order = self._tied = None
        self._flat: dict[bytes, list[int]] = {}
        if self._u.size <= PRECOMPUTE_LIMIT:
            self._order, self._tied = self._orders(self._u)

    @staticmethod
    def _orders(u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        order = np.argsort(-u, axis=1, kind="stable")  # ties: the lower group, i.e. the lower first index
        su = np.take_along_axis(u, order, axis=1)
        tied = (su[:, 1:] == su[:, :-1]).any(axis=1) if u.shape[1] > 1 else np.zeros(len(u), dtype=bool)
        return order, tied | np.isnan(u).any(axis=1)

    def order(self, i: int) -> np.ndarray:
        if self._order is not None:
            return self._order[i]
        return self._orders(self._u[i:i + 1])[0][0]

    def tied(self, i: int) -> bool:
        if self._tied is not None:
            return bool(self._tied[i])
        return bool(self._orders(self._u[i:i + 1])[1][0])

    def flat_order(self, i: int, u: np.ndarray) -> list[int]:
        """The one-level walk: instances by (-utility, index)."""
        if self.singletons or self.tied(i):
            return sorted(range(self.n_instances), key=lambda j: (-u[j], j))
        order = self.order(i)
        key = order.tobytes()
        out = self._flat.get(key)
        if out is None:  # a few models: a few orders, each built once
            out = self._flat[key] = [j for g in order for j in self.member_lists[g]]
        return out


class TieBreaker:
    """The level-2 order of a group under a tie policy (``random``: its own
    generator, seeded by the replay seed, drawn only for groups of more
    than one replica, so a pool of singletons draws nothing)."""

    def __init__(self, ties: str, seed: int):
        self.ties = check_ties(ties)
        self.rng = np.random.default_rng(seed)
        self._u: list[float] = []  # uniforms drawn ahead in blocks (a Generator call costs ~1 us)
        self._k = 0

    def _uniform(self) -> float:
        if self._k == len(self._u):
            self._u, self._k = self.rng.random(UNIFORM_BLOCK).tolist(), 0
        self._k += 1
        return self._u[self._k - 1]

    def walk(self, members: list[int]):
        """``members`` in the policy's order; random: a uniform permutation
        drawn lazily (Fisher-Yates, one uniform per replica visited), so a
        walk that stops at the first replica draws one number."""
        if self.ties != "random" or len(members) == 1:
            yield from members
            return
        rest = list(members)
        for m in range(len(rest), 0, -1):
            k = int(self._uniform() * m)
            rest[k], rest[m - 1] = rest[m - 1], rest[k]
            yield rest[m - 1]

    def pick(self, candidates: list[int]) -> int:
        """One of equally good candidates (in index order)."""
        if self.ties == "random" and len(candidates) > 1:
            return candidates[int(self._uniform() * len(candidates))]
        return candidates[0]


def lazy_reads(tie: TieBreaker, walks: bool) -> str:
    """What a two-level router tells the twin it reads (``Router.reads``):
    ``indexed`` (views one at a time, each brought to the present as read,
    the others left in their steady runs) for a walking rule (hard, cc)
    with random ties, which reads about one view per decision; ``views``
    otherwise. Why not always: least-latency reads every replica of the
    chosen model and lowest-index every full one, and bringing that many
    views one by one cost more than refreshing the changed ones in one
    compiled call (qwen3-h100-x8, least-latency: 40% slower)."""
    return "indexed" if walks and tie.ties == "random" else "views"


def hard_choice(r, i: int, t: float, insts, slo: float, u: np.ndarray) -> int:
    """The hard rule over groups (``r``: a ``LatencyAware``, with
    ``groups``, ``tie``, ``latency``, ``estimate_one`` and, when
    ``r.prune``, ``bound_one``: a lower bound on ``estimate_one``).

    Pruning is exact: an instance whose bound exceeds the SLO cannot meet
    it, so it is not estimated (nor, under least-latency, which visits a
    group's replicas by ascending bound, one whose bound exceeds the
    group's best estimate so far: ties go to the lower index as without
    pruning); when no instance meets the SLO, the
    rule's fallback (the fastest of all, ``hard_rule``) estimates a pruned
    instance only if its bound does not exceed the fastest estimate found,
    so the decision is the one the unpruned rule takes."""
    lat = r.latency
    lat[:] = np.inf
    groups, tie = r.groups, r.tie
    seen = r.seen  # per instance: its last estimate or bound (any query), for the gate below
    bound = est = None
    if r.prune and not groups.singletons:  # a few instances: a bound would save at most a few estimates
        # a bound is tried only where the instance's last figure came near the SLO: elsewhere it would
        # not prune and costs a good part of an estimate (which instances are bounded never changes a decision)
        gate = PRUNE_GATE * slo

        def est(j, i, t, insts):
            seen[j] = x = r.estimate_one(j, i, t, insts)
            return x

        def bound(j, i, t, insts):
            if seen[j] < gate:
                return -np.inf
            seen[j] = b = r.bound_one(j, i, t, insts)
            return b
    else:
        est = r.estimate_one
    pruned: list[tuple[float, int]] = []
    if tie.ties == "least-latency" and not groups.singletons:
        for g in groups.order(i):
            best, best_l = -1, np.inf
            members = groups.member_lists[g]
            # by ascending bound: once a bound exceeds the SLO or the best estimate so far, so do the rest
            cands = sorted([(bound(j, i, t, insts), j) for j in members]) if bound is not None else \
                [(-np.inf, j) for j in members]
            for k, (b, j) in enumerate(cands):
                if b > slo or (best >= 0 and b > best_l):
                    pruned.extend(cands[k:])
                    break
                lat[j] = x = est(j, i, t, insts)
                if x <= slo and (x < best_l or (x == best_l and j < best)):
                    best, best_l = j, x
            if best >= 0:
                return best
    else:
        walk = groups.flat_order(i, u) if tie.ties == "lowest-index" or groups.singletons else None
        for j in walk if walk is not None else _random_walk(groups, tie, i):
            if bound is not None:
                b = bound(j, i, t, insts)
                if b > slo:
                    pruned.append((b, j))
                    continue
            lat[j] = x = est(j, i, t, insts)
            if x <= slo:
                return j
    if pruned:
        fastest = np.inf
        for j in range(len(lat)):
            if lat[j] < fastest:
                fastest = lat[j]
        for b, j in sorted(pruned):
            if not b <= fastest:
                break
            lat[j] = x = est(j, i, t, insts)
            if x < fastest:
                fastest = x
    if not np.isnan(lat).any():  # none meets the SLO: hard_rule's fastest, its first minimum
        return int(np.argmin(lat))
    return hard_rule(u, lat, slo)


def _random_walk(groups: ModelGroups, tie: TieBreaker, i: int):
    for g in groups.order(i):
        yield from tie.walk(groups.member_lists[g])


def chance_walk(r, i: int, t: float, insts, slo: float) -> int:
    """The chance constraint over groups (``r``: a ``ChanceRouter``): the
    first group whose best replica has P(on time) >= 1 - epsilon; its
    replica by the tie policy (least-latency: the highest P(on time), then
    the lowest estimate, then the lowest index); else the likeliest on time.
    The query's utility row is read only for the one-level walk (the
    groups' order is precomputed)."""
    p, lat = r.p, r.latency
    p[:] = 0.0
    lat[:] = np.inf
    need = 1.0 - r.epsilon
    groups, tie = r.groups, r.tie
    if tie.ties == "least-latency" and not groups.singletons:
        for g in groups.order(i):
            best = -1
            for j in groups.member_lists[g]:
                p[j] = x = r.p_on_time(j, i, t, slo, insts)
                if x >= need and (best < 0 or x > p[best] or (x == p[best] and lat[j] < lat[best])):
                    best = j
            if best >= 0:
                return best
    else:
        walk = groups.flat_order(i, r.inputs.utility[i]) if tie.ties == "lowest-index" or groups.singletons \
            else None
        for j in walk if walk is not None else _random_walk(groups, tie, i):
            p[j] = x = r.p_on_time(j, i, t, slo, insts)
            if x >= need:
                return j
    return r._most_likely()


def break_tie(r, best: int, score) -> int:
    """Level 2 after a rule that scores every instance (expected on-time
    utility, the soft rule): among ``best``'s replicas scoring exactly as
    well, the tie policy's choice (least-latency: the lowest estimate, ties
    lowest index). ``score(j)``: instance ``j``'s score. A group of one
    keeps ``best``: the one-level rule's choice."""
    members = r.groups.member_lists[r.groups.group_of[best]]
    if r.tie.ties == "lowest-index" or len(members) == 1:
        return best
    top = score(best)
    cands = [j for j in members if score(j) == top]
    if r.tie.ties == "least-latency":
        return min(cands, key=lambda j: (r.latency[j], j))
    return r.tie.pick(cands)
