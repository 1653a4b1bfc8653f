"""What a sweep builds once before its directory exists: every plug-in
router of the sweep, on the first cell's workload.

Kept apart from ``harness.sweep.driver`` (which runs and summarises the
cells) so that module stays under the house size limit; the CLI calls it
between its option checks and opening the sweep's store.
"""
from __future__ import annotations

from harness.sweep.driver import Cell, SweepSpec, cell_workload
from harness.twin.pools.spec import load_pool
from harness.twin.replay import WorkloadInputs, workload_inputs
from harness.twin.simulation import InstanceSpec
from traces.errors import BadOption


def check_routers(spec: SweepSpec, cells: list[Cell]) -> WorkloadInputs:
    """Build every plug-in router of the sweep once on the first cell's
    workload, before the sweep directory is created: a plug-in whose
    constructor fails is refused in one line instead of after OUT was
    written (a worker would otherwise hit it in the first cell). Returns
    the first cell's policies (``sweep_inputs``) for the caller to echo."""
    from harness.twin.pool_baselines import pool_baselines
    from routers.foreign import IsolatedRouter
    from routers.registry import make_router, needs_baselines
    from traces.errors import BadInput

    reqs, quality = cell_workload(spec, cells[0])
    pool = load_pool(spec.pool)
    specs = [InstanceSpec.from_config(c) for c in pool.instances]
    inputs = workload_inputs(reqs, quality, specs, spec.replay_config(cells[0]))
    for cell in {c.router: c for c in cells}.values():
        if ":" not in cell.router:  # built-in routers are latroute's own code
            continue
        baselines = pool_baselines(spec.pool) if needs_baselines(cell.router) else None
        try:
            router = make_router(cell.router, inputs.route, specs, pool.frontend_overhead_s, cell.delta_per_us,
                                 cell.seed, baselines, online_speed=spec.online_speed, epsilon=spec.epsilon,
                                 ties=spec.ties, true_outputs=reqs["output_tokens"].to_numpy(),
                                 isolate_s=spec.plugin_timeout_s)
            if isinstance(router, IsolatedRouter):  # built in its own process: checked there, then let go
                router.close()
        except BadInput:
            raise
        except Exception as e:  # foreign code: whatever it raises is its refusal, named
            raise BadOption(f"plug-in {cell.router!r}", f"its constructor raised {type(e).__name__}: {e} "
                            "(nothing was written)") from None
    return inputs
