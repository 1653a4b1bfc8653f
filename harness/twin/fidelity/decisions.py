"""Decision agreement: does the scheduler kernel choose exactly the batches a
real engine chose?

For every recorded step the pre-step state is rebuilt from the recording
(requests join ``waiting`` at their ``added_s`` step boundary; running order
is admission order; the recorded batches and preemptions so far are
applied), the kernel schedules a copy of it, and its batch is compared with
the recorded one: same requests, same token counts, same computed tokens before each
chunk (with prefix caching: the same hits, the cache's contents being
rebuilt along the recorded batches), same order. The real
state then advances by the *recorded* batch, so one disagreement cannot
cascade into the next steps.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from estimators.engine.kernel import schedule_step
from estimators.engine.layout import F_RID, S_NPREEMPT
from estimators.engine.state import StepPlan
from estimators.snapshot import RecordedWalk
from traces.store import Trace


@dataclass
class StepMismatch:
    step: int
    recorded: list[tuple[int, int, int]]  # (request, tokens, computed before)
    kernel: list[tuple[int, int, int]]
    recorded_preempted: list[int]
    kernel_preempted: list[int]


@dataclass
class AgreementResult:
    steps: int = 0
    agree: int = 0  # same requests, tokens and order, same preemptions
    agree_as_set: int = 0  # same (request, tokens) pairs in any order
    mismatches: list[StepMismatch] = field(default_factory=list)
    first_computed: dict[int, int] = field(default_factory=dict)  # request id -> computed before its first chunk

    @property
    def rate(self) -> float:
        return self.agree / self.steps if self.steps else float("nan")

    def to_json(self, keep: int = 20) -> dict:
        return {"steps": self.steps, "agree": self.agree, "agree_as_set": self.agree_as_set, "rate": self.rate,
                "first_mismatches": [m.__dict__ for m in self.mismatches[:keep]]}


def decision_agreement(trace: Trace, instance_id: str | None = None) -> AgreementResult:
    instances = trace.read("instances")
    instance_id = instance_id or str(instances["instance_id"].iloc[0])
    reqs = trace.read("requests")
    walk = RecordedWalk(trace, instance_id, reqs)
    rids = reqs["request_id"].to_numpy()
    plan = StepPlan.new(walk.state.capacity)
    result = AgreementResult()
    for k in range(len(walk.start)):
        with walk.refusing(int(walk.step_ids[k])):
            walk.prepare(k)
        trial = walk.state.copy()
        n = schedule_step(trial, plan)
        kernel = [(int(rids[trial.req[plan.slot[j], F_RID]]), int(plan.tokens[j]), int(plan.computed[j]))
                  for j in range(n)]
        for rid, _, cb in kernel:
            result.first_computed.setdefault(rid, cb)  # with prefix caching: the hit granted at admission
        a, b = walk.item_off[k], walk.item_off[k + 1]
        recorded = [(int(rids[i]), int(t), int(c))
                    for i, t, c in zip(walk.item_req[a:b], walk.item_tok[a:b], walk.item_cb[a:b])]
        kernel_pre = [int(rids[trial.req[s, F_RID]]) for s in plan.preempted[: int(trial.sc[S_NPREEMPT])]]
        rec_pre = [int(rids[i]) for i in walk.pre_req[walk.pre_off[k]: walk.pre_off[k + 1]]]
        result.steps += 1
        same_pre = sorted(kernel_pre) == sorted(rec_pre)
        if kernel == recorded and same_pre:
            result.agree += 1
        else:
            result.mismatches.append(StepMismatch(int(walk.step_ids[k]), recorded, kernel, rec_pre, kernel_pre))
        if sorted(kernel) == sorted(recorded) and same_pre:
            result.agree_as_set += 1
        with walk.refusing(int(walk.step_ids[k])):  # a batch the state cannot take: the trace's refusal
            walk.apply(k)
            walk.complete(k)
    return result
