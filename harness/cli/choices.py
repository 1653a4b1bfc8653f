"""The names and defaults the command line shows before it runs anything.

Every command's ``--help`` (and its option parsing) must answer without
importing numba, numpy, pandas, duckdb or pyarrow, yet its option choices
and defaults live in modules that load them: the router registry builds its
routers' estimators, the arrival kinds sit beside the generators. Those
values are written here a second time, as plain literals, and
tests/test_cli_help.py checks each against the module that owns it, so a
name added there and not here fails the tests rather than drifting from
the help.
"""
from __future__ import annotations

# routers.registry.ROUTERS (registry order) and MAIN_ROUTERS (the default sweep)
ROUTERS = ("round-robin", "shortest-queue", "least-tokens", "power-of-two", "prefix-affinity", "prefix-load",
           "latency-agnostic", "sfs-hard", "sfs-soft", "throughput-hard", "throughput-soft", "lps-hard", "lps-soft",
           "lps-mg-hard", "lps-mg-soft", "queue-hard", "queue-soft", "sfs-cc", "sfs-eu", "throughput-cc",
           "throughput-eu", "oracle", "learned-hard", "learned-cc", "llmd-headroom", "llmd-admit")
MAIN_ROUTERS = ("shortest-queue", "latency-agnostic", "sfs-hard", "sfs-soft", "sfs-cc", "sfs-eu")
# routers.utility.DEFAULT_LAMBDA, routers.chance.DEFAULT_EPSILON, routers.fleet.TIE_POLICIES / DEFAULT_TIES
DEFAULT_LAMBDA = 5e-4
DEFAULT_EPSILON = 0.1
TIE_POLICIES = ("lowest-index", "least-latency", "random")
DEFAULT_TIES = "random"

# estimators.estimate.ESTIMATORS (the default list) and KNOWN_ESTIMATORS (with the optional ones)
ESTIMATORS = ("sfs", "throughput", "lps", "lps-mg", "queue")
KNOWN_ESTIMATORS = ("sfs", "throughput", "lps", "lps-mg", "queue", "learned")
# estimators.learned.model: RETRAIN_EVERY_S, WINDOW, MIN_SAMPLES
LEARNED_RETRAIN_EVERY_S = 1.0
LEARNED_WINDOW = 100
LEARNED_MIN_SAMPLES = 10
# estimators.timemodel.online_speed.HALF_LIFE_STEPS, estimators.evaluate.conformal.STEP
SPEED_HALF_LIFE_STEPS = 100.0
RECALIBRATION_STEP = 0.1
# the keys of estimators.timemodel.features.FORMS, estimators.timemodel.fit.LOSSES
FORMS = ("eq9", "six")
LOSSES = ("relative", "absolute")

# traces.workload.arrivals.ARRIVAL_KINDS, traces.policies.lengths.LENGTH_POLICIES, traces.policies.quality.QUALITY_POLICIES,
# traces.policies.slo.SLO_POLICIES
ARRIVAL_KINDS = ("poisson", "mmpp", "gamma", "azure-conv")
LENGTH_POLICIES = ("column", "median", "constant:N", "oracle")
QUALITY_POLICIES = ("model", "table", "none", "FILE")
SLO_POLICIES = ("rule", "column", "constant:MS", "none")
# harness.route.inputs: ROUTE_SLO_POLICIES, ROUTE_QUALITY_POLICIES (besides a quality file)
ROUTE_SLO_POLICIES = ("rule", "constant:MS", "none")
ROUTE_QUALITY_POLICIES = ("model", "request", "none")

# every mirrored value: (name here, module that owns it, its name there); a list or dict there is compared as
# the tuple of its items or keys
MIRRORED = (
    ("ROUTERS", "routers.registry", "ROUTERS"),
    ("MAIN_ROUTERS", "routers.registry", "MAIN_ROUTERS"),
    ("DEFAULT_LAMBDA", "routers.utility", "DEFAULT_LAMBDA"),
    ("DEFAULT_EPSILON", "routers.chance", "DEFAULT_EPSILON"),
    ("TIE_POLICIES", "routers.fleet", "TIE_POLICIES"),
    ("DEFAULT_TIES", "routers.fleet", "DEFAULT_TIES"),
    ("ESTIMATORS", "estimators.estimate", "ESTIMATORS"),
    ("KNOWN_ESTIMATORS", "estimators.estimate", "KNOWN_ESTIMATORS"),
    ("LEARNED_RETRAIN_EVERY_S", "estimators.learned.model", "RETRAIN_EVERY_S"),
    ("LEARNED_WINDOW", "estimators.learned.model", "WINDOW"),
    ("LEARNED_MIN_SAMPLES", "estimators.learned.model", "MIN_SAMPLES"),
    ("SPEED_HALF_LIFE_STEPS", "estimators.timemodel.online_speed", "HALF_LIFE_STEPS"),
    ("RECALIBRATION_STEP", "estimators.evaluate.conformal", "STEP"),
    ("FORMS", "estimators.timemodel.features", "FORMS"),
    ("LOSSES", "estimators.timemodel.fit", "LOSSES"),
    ("ARRIVAL_KINDS", "traces.workload.arrivals", "ARRIVAL_KINDS"),
    ("LENGTH_POLICIES", "traces.policies.lengths", "LENGTH_POLICIES"),
    ("QUALITY_POLICIES", "traces.policies.quality", "QUALITY_POLICIES"),
    ("SLO_POLICIES", "traces.policies.slo", "SLO_POLICIES"),
    ("ROUTE_SLO_POLICIES", "harness.route.inputs", "ROUTE_SLO_POLICIES"),
    ("ROUTE_QUALITY_POLICIES", "harness.route.inputs", "ROUTE_QUALITY_POLICIES"),
)
