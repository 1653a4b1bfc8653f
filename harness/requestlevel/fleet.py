"""The fleet behind a request log: how many replicas served it, and which
request each one got.

Why: a production log comes from several replicas of one model behind a
Service or a router. Replayed on one engine, a 2-replica log queues what
the deployment ran side by side, and a fit absorbs the error into its
coefficients without a word (TPOT +180-211% on the H100 LMBench runs). So
the replica count is a stated setting (``--replicas N``, or a pool's
entries), and so is the assignment:

- where the log names each request's serving instance (the requests
  table's ``instance_id``; importers map a source's pod, host or upstream
  field to it), that assignment is replayed (``LOGGED``);
- where it does not, the deployment's routing is stated with ``--assign``
  (``ASSIGN``), and a fit or a score uses several seeds of it
  (``--assign-seeds``, default ``DEFAULT_SEEDS``), reporting the spread.

What deployments do (the documentation page ``how-to/request-level.md``
cites the sources): a Kubernetes Service in kube-proxy's iptables mode picks
a backend at random, in IPVS mode round-robin unless another scheduler is
set, both per connection (an HTTP client that keeps its connections alive
sends all of a connection's requests to one pod); Envoy's default cluster
policy is round-robin, its least-request policy compares two random hosts'
active requests when weights are equal; vLLM's production-stack router
(Helm chart default) rotates round-robin per request.

Round-robin and random assignments do not depend on the engines' state, so
each replica is replayed on its own (``harness.requestlevel.replay``).
Round-robin over identical replicas has one partition of the requests
whatever its start: its seeds give one replay (``distinct``). Least
requests depends on when requests finish: ``harness.requestlevel.fleet_replay``
decides it on the twin itself. A replica count of 0 and a log that names
more instances than the fleet has are refused before any work.

This module holds the settings (from the options, a pool or a profile's
fit: ``fleet_spec``), the assignments that need no engine, and the checks
against a log; it replays nothing.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from traces.errors import BadInput, BadOption

ROUND_ROBIN, RANDOM, LEAST_REQUESTS = "round-robin", "random", "least-requests"
ASSIGN = (ROUND_ROBIN, RANDOM, LEAST_REQUESTS)
LOGGED = "logged"  # the log's own instance_id column
DEFAULT_SEEDS = 5
MAX_REPLICAS = 4096  # as a pool's entry (harness.twin.pools.spec)
INSTANCE_COLUMN = "instance_id"


@dataclass(frozen=True)
class Fleet:
    """One replay's fleet: ``replicas`` identical engines, requests assigned
    by ``assign`` (``ASSIGN`` or ``LOGGED``) with ``seed``."""

    replicas: int = 1
    assign: str = ROUND_ROBIN
    seed: int = 0

    def to_json(self) -> dict:
        return {"replicas": self.replicas, "assign": self.assign, "seed": self.seed}


@dataclass(frozen=True)
class FleetSpec:
    """What a command was told about the fleet behind its logs.

    ``replicas`` and where that number comes from (``source``: an option, a
    pool, a profile's fit, or the default of one); ``assign`` (None: not
    stated) and the seeds to use; ``engine``: settings a pool's entry
    states (they act as ``--engine`` options do)."""

    replicas: int = 1
    assign: str | None = None
    seeds: int = DEFAULT_SEEDS
    source: str = "one replica (default)"
    engine: dict = field(default_factory=dict)
    stated: bool = False  # replicas said by the user (an option, a pool, a profile), not the default
    seeds_stated: bool = False  # --assign-seeds typed (refused on a log that names its instances: nothing to draw)

    def to_json(self) -> dict:
        return {"replicas": self.replicas, "assign": self.assign, "assign_seeds": self.seeds, "source": self.source}

    @classmethod
    def from_json(cls, doc: dict | None, source: str) -> FleetSpec | None:
        """A profile's ``fitted_on.fleet`` (None when the fit was on one engine)."""
        if not doc or int(doc.get("replicas", 1)) <= 1 and doc.get("assign") in (None, LOGGED):
            return None
        return cls(int(doc["replicas"]), doc.get("assign"), int(doc.get("assign_seeds", DEFAULT_SEEDS)), source,
                   stated=True)


def check_replicas(n: object, option: str = "--replicas") -> int:
    if isinstance(n, bool) or not isinstance(n, int | np.integer) or not 1 <= int(n) <= MAX_REPLICAS:
        raise BadOption(option, f"must be a whole number of replicas in [1, {MAX_REPLICAS}], got {n!r}")
    return int(n)


def logged_instances(reqs: pd.DataFrame, source: str) -> np.ndarray | None:
    """The instance each request was served by, as codes 0..m-1 (in order of
    the ids' sorted names), or None when the log does not say. A column
    naming some requests' instances and not others' is refused."""
    if INSTANCE_COLUMN not in reqs:
        return None
    col = reqs[INSTANCE_COLUMN]
    missing = np.flatnonzero(col.isna().to_numpy())
    if missing.size == len(col):
        return None
    if missing.size:
        rid = reqs["request_id"].iloc[int(missing[0])]
        raise BadInput(source, None, INSTANCE_COLUMN, f"request {rid} names no serving instance while others do: "
                                                      "a log names every request's instance or none")
    codes, _ = pd.factorize(col.astype(str), sort=True)
    return codes.astype(np.int64)


def static_assignment(n: int, fleet: Fleet) -> np.ndarray:
    """The replica of each of ``n`` requests (in arrival order) for a policy
    that does not look at the engines: round-robin starting at
    ``seed mod replicas``, or uniform at random from ``seed``."""
    if fleet.assign == ROUND_ROBIN:
        return (np.arange(n, dtype=np.int64) + fleet.seed) % fleet.replicas
    if fleet.assign == RANDOM:
        return np.random.default_rng([fleet.seed, fleet.replicas]).integers(0, fleet.replicas, n).astype(np.int64)
    raise ValueError(f"{fleet.assign} depends on the engines' state")


def partition_key(assignment: np.ndarray) -> bytes:
    """The partition an assignment makes, whatever the replicas' labels
    (replicas are identical: round-robin started at replica 1 serves the
    same sets of requests as started at 0)."""
    codes, _ = pd.factorize(pd.Series(assignment))
    return codes.astype(np.int64).tobytes()


def seeds_of(spec: FleetSpec, n: int) -> tuple[list[Fleet], int]:
    """The fleets to replay for ``spec`` on a log of ``n`` requests that
    names no instance: one per distinct assignment of its seeds (least
    requests: every seed, its assignment is made on the twin). Returns them
    and the number of seeds they stand for."""
    fleets, seen = [], set()
    for s in range(spec.seeds):
        f = Fleet(spec.replicas, spec.assign, s)
        if spec.assign != LEAST_REQUESTS:
            key = partition_key(static_assignment(n, f))
            if key in seen:
                continue
            seen.add(key)
        fleets.append(f)
    return fleets, spec.seeds


def check_against_log(spec: FleetSpec, logged: np.ndarray, reqs: pd.DataFrame, source: str) -> Fleet:
    """The fleet of a log that names its instances (``logged``: codes, in
    arrival order): refused when it names more instances than the fleet
    stated has, or when a stated round-robin is not what the log shows."""
    m = int(logged.max()) + 1 if logged.size else 1
    if spec.seeds_stated:
        raise BadOption("--assign-seeds", f"{source} names each request's serving instance: its assignment is replayed, "
                                          "there are no seeds to draw")
    if spec.stated and m > spec.replicas:
        raise BadInput(source, None, INSTANCE_COLUMN,
                       f"names {m} serving instances, but {spec.source} has {spec.replicas} replica(s): the log "
                       f"contradicts the fleet (give --replicas {m} or a pool of {m})")
    if spec.assign == ROUND_ROBIN and m > 1:
        seen_at = np.full(m, -1)
        bad = -1
        for i, c in enumerate(logged[:m]):  # the first m requests set up the rotation, each to another instance
            if seen_at[c] >= 0:
                bad = i
                break
            seen_at[c] = i
        if bad < 0:
            off = np.flatnonzero(logged != logged[np.arange(logged.size) % m])
            bad = int(off[0]) if off.size else -1
        if bad >= 0:
            rid, name = reqs["request_id"].iloc[bad], reqs[INSTANCE_COLUMN].iloc[bad]
            raise BadOption("--assign", f"round-robin is not what {source} shows: its {INSTANCE_COLUMN} column sends "
                                        f"request {rid} (arrival #{bad + 1}) to {name} out of turn over the {m} "
                                        "instances; drop --assign to replay the logged assignment")
    return Fleet(m, LOGGED, 0)


def replica_seed(seed: int, k: int) -> int:
    """The noise seed of replica ``k``'s twin: its own stream (replica 0
    keeps ``seed``, so one replica replays as one engine does)."""
    return seed if k == 0 else int(np.random.SeedSequence([seed, k]).generate_state(1)[0])


def fleet_spec(pool_ref, replicas: int | None, assign: str | None, seeds: int, given: set[str],
               fitted: dict | None = None, fitted_source: str = "", writes: tuple[str, ...] | None = None):
    """The fleet a command's options state, and the pool when one is given.

    ``given``: the fleet options typed (``--pool``, ``--replicas``,
    ``--assign``, ``--assign-seeds``); ``fitted``: the profile's
    ``fitted_on.fleet`` (validate, estimate), taken when neither a pool nor
    a replica count is given (``--assign`` and ``--assign-seeds`` then
    restate its assignment); ``writes``: the names of the profile a
    calibration writes (a pool for it must name that profile). Returns
    ``(FleetSpec or None, Pool or None)``; None: one engine."""
    if pool_ref is not None and replicas is not None:
        raise BadOption("--replicas", "the pool's entries give the replica count: give --pool or --replicas, not both")
    restated = {o for o in ("--assign", "--assign-seeds") if o in given}
    if pool_ref is None and replicas is None:
        spec = FleetSpec.from_json(fitted, fitted_source) if fitted else None
        if spec is None:
            if restated:
                raise BadOption(sorted(restated)[0], "only with a fleet of several replicas (--replicas N, --pool FILE, "
                                                     "or a profile fitted on one)")
            return None, None
        return FleetSpec(spec.replicas, assign or spec.assign, seeds if "--assign-seeds" in given else spec.seeds,
                         spec.source, stated=True, seeds_stated="--assign-seeds" in given), None
    pool = None
    if pool_ref is not None:
        spec, pool = _pool_spec(pool_ref, assign, seeds, writes)
    else:
        spec = FleetSpec(check_replicas(replicas), assign, seeds, "--replicas", stated=True)
    if spec.replicas == 1 and restated:
        raise BadOption(sorted(restated)[0], f"{spec.source} gives one replica: there is no assignment to state")
    return replace(spec, seeds_stated="--assign-seeds" in given), pool


@dataclass(frozen=True)
class ScoredFleet:
    """What ``validate`` and ``estimate`` replay a request log on: the fleet, and the profile and
    front end its engines run (the pool's first entry when a pool is given, else the ``--profile``
    given)."""

    spec: FleetSpec | None
    pool: object | None  # harness.twin.pools.spec.Pool
    profile_ref: object  # a profile's path or name, as --profile takes it
    frontend: object | None  # harness.requestlevel.frontend.FrontEnd; None: the profile's
    frontend_overhead_s: float | None  # None: the profile's


def fleet_to_score(profile_ref, fitted, pool_ref, replicas: int | None, assign: str | None, seeds: int,
                   given: set[str]) -> ScoredFleet:
    """``fleet_spec`` for the commands that score a fitted profile on a log: the profile's own
    fitted fleet unless the options state another, and a pool's profile and front end in place of
    ``--profile``'s. ``fitted``: the loaded profile, or None."""
    from harness.requestlevel.frontend import FrontEnd

    spec, pool = fleet_spec(pool_ref, replicas, assign, seeds, given,
                            fitted=fitted.fitted_on.get("fleet") if fitted else None,
                            fitted_source=f"profile {fitted.name}'s fit" if fitted else "")
    if pool is None:
        return ScoredFleet(spec, None, profile_ref, None, None)
    return ScoredFleet(spec, pool, pool.instances[0].profile,
                       FrontEnd.from_json(pool.frontends[0] if pool.frontends else None), pool.frontend_overhead_s)


def _pool_spec(ref, assign: str | None, seeds: int, writes: tuple[str, ...] | None):
    """A pool of one model's identical replicas as a fleet."""
    from dataclasses import asdict

    from harness.twin.pools.spec import load_pool

    pool = load_pool(ref, serial_frontend=True, profiles=writes is None)
    insts = pool.instances
    for key in ("model", "profile"):
        names = sorted({getattr(c, key) for c in insts})
        if len(names) > 1:
            raise BadInput(ref, None, f"instances.{key}", f"names {', '.join(map(repr, names))}: a request log is "
                                                          "replayed on one model's replicas, sharing one profile")
    if writes is not None and insts[0].profile not in writes:
        raise BadInput(ref, None, "instances.profile", f"names {insts[0].profile!r}, but this calibration writes "
                                                       f"{writes[0]}: a pool for it names the profile it fits")
    first = {k: v for k, v in asdict(insts[0]).items() if k != "instance_id"}
    for c in insts[1:]:
        other = {k: v for k, v in asdict(c).items() if k != "instance_id"}
        diff = sorted(k for k in first if first[k] != other[k])
        if diff:
            raise BadInput(ref, None, f"instances.{diff[0]}", f"{insts[0].instance_id} and {c.instance_id} differ: "
                                                              "the replicas of a request log are replayed alike")
    entry = {k: getattr(insts[0], k) for k, src in (pool.sources[0] if pool.sources else {}).items()
             if src == "pool entry"}
    return FleetSpec(len(insts), assign, seeds, f"pool {ref}", engine=entry, stated=True), pool
