"""The index names of the state arrays (``req[:, F_*]``, ``sc[S_*]``,
``cfg[C_*]``, ``StepPlan.counts[PL_*]``), statuses and step events; see
``state`` for what each array holds."""
from __future__ import annotations

# --- per-request fields
F_PROMPT = 0  # prompt tokens P
F_TARGET = 1  # outputs to produce before finishing (true length in the twin, predicted in SFS)
F_COMPUTED = 2  # num_computed_tokens (advanced at schedule time, as vLLM does)
F_OUTPUTS = 3  # outputs produced so far O; num_tokens = P + O
F_BLOCKS = 4  # KV blocks held
F_STATUS = 5
F_RID = 6  # request id
F_HIT = 7  # prefix-cache hit tokens available at admission (block aligned)
F_PREEMPTIONS = 8
F_EVENT = 9  # set by complete_step: EV_* bits
F_NCACHED = 10  # prefix caching: leading blocks registered in the cache (vLLM's num_cached_block)
F_HITB = 11  # SFS overlay: live hit blocks taken at admission, or -(live blocks + 1) for a live holder
NF = 12  # the row of every instance (SFS copies NF fields per resident: sync rows keep their width)
# async scheduling only (``docs/reference/async-scheduling.md``): one more column, read and written only when
# cfg[C_ASYNC] is on (``SchedState.new`` gives async instances NF_ASYNC columns)
F_PH = 12  # vLLM's num_output_placeholders: tokens sampled by steps in flight, counted in F_COMPUTED
NF_ASYNC = 13
# priority scheduling only (cfg[C_SCHED_PRIORITY] on; ``SchedState.new`` gives such instances NF_PRIORITY columns,
# F_PH included, whether async or not): the keys that order waiting and choose the preemption victim
F_PRIO = 13  # vLLM's Request.priority (lower runs first)
F_ARRIVAL = 14  # arrival time as an integer (equal for requests that arrived together; ``add``: default the request id)
NF_PRIORITY = 15

# statuses
ST_FREE, ST_WAITING, ST_RUNNING, ST_FINISHED, ST_PENDING, ST_REJECTED = 0, 1, 2, 3, 4, 5
# events of the last step (bits of F_EVENT)
EV_FIRST, EV_FINISH, EV_REJECT, EV_LENGTH = 1, 2, 4, 8  # EV_LENGTH: finished at max_model_len
# finish reasons as vLLM names them (vllm.v1.engine.FinishReason)
FINISH_REASONS = ("stop", "length")

# --- scalars
S_NR = 0  # running count
S_WHEAD = 1  # waiting head index
S_WN = 2  # waiting count
S_FREE_BLOCKS = 3  # usable free KV blocks
S_NFREE_SLOTS = 4
S_NPREEMPT = 5  # preemptions in the last scheduled step
S_CAP = 6  # rows of req
S_STEP = 7  # steps scheduled so far
NS = 8

# --- configuration (written by InstanceConfig.to_array)
C_POLICY = 0
C_BUDGET = 1  # max_num_batched_tokens (Sarathi: chunk size)
C_MAX_SEQS = 2
C_BLOCK = 3
C_NUM_BLOCKS = 4  # as configured; one is vLLM's null block
C_LONG_PREFILL = 5  # long_prefill_token_threshold, 0 = off
C_CHUNKED = 6
C_MAX_LEN = 7  # max_model_len
C_WATERMARK = 8  # blocks kept free at admission
C_PREFIX = 9  # prefix caching: 0 off, 1 on (``SchedState.bc`` holds the KV blocks), 2 SFS overlay
PREFIX_OFF, PREFIX_ON, PREFIX_OVERLAY = 0, 1, 2
C_ASYNC = 10  # async scheduling: 1 = vLLM's AsyncScheduler (placeholders, stale outputs), 0 = sync
C_RULES = 11  # the release's rules: R_* bits of ``releases`` (0 = vLLM 0.32's)
C_SCHED_PRIORITY = 12  # vLLM's --scheduling-policy: 0 fcfs, 1 priority (waiting ordered by F_PRIO, F_ARRIVAL, F_RID)
NC = 13

# --- plan counts
PL_N = 0  # requests in the batch
PL_NREJ = 1  # slots refused outright this step
NPL = 2


class KernelInputError(ValueError):
    """A compiled entry refused its input (an index out of range, a request
    in a state a step cannot touch, a non-finite time): raised at the
    kernel's entry, before any array is indexed by the bad value, so corrupt
    input ends in an exception the caller turns into a refusal naming its
    file instead of a write past an array's end. Defined here, with the
    layout, because every compiled module imports this one."""
