"""The peer suite's scenarios: the engine settings and requests each
fixture is recorded from (``generate_fixtures.py``, run in vLLM's own
environment) -- vLLM's scheduler tests expressed as latroute scenarios, and
the async-specific ones. Plain data built by plain functions: no
vLLM and no latroute import, so both sides can read them."""
from __future__ import annotations

SCHEDULER_TESTS = "tests/v1/core/test_scheduler.py"
PREFIX_TESTS = "tests/v1/core/test_prefix_caching.py"
OURS = "latroute"
OURS_ASYNC = "latroute"
ASYNC_TESTS = "tests/v1/core/test_async_scheduler.py"


def engine(budget=8192, max_num_seqs=16, block_size=16, num_blocks=10000, long_prefill=0, max_model_len=None,
           prefix_caching=False, chunked_prefill=True):
    """An engine configuration; the defaults are those of vLLM's test helper
    ``create_scheduler`` (max_model_len defaults to the token budget)."""
    return {"max_num_batched_tokens": budget, "max_num_seqs": max_num_seqs, "block_size": block_size,
            "num_blocks": num_blocks, "long_prefill_token_threshold": long_prefill,
            "max_model_len": max_model_len or budget, "prefix_caching": prefix_caching,
            "chunked_prefill": chunked_prefill}


def req(rid, prompt, max_tokens=16, arrival_step=1, blocks=None):
    r = {"id": str(rid), "prompt": prompt, "max_tokens": max_tokens, "arrival_step": arrival_step}
    if blocks is not None:
        r["blocks"] = list(blocks)
    return r


def scenario(name, source, test, description, eng, requests):
    return {"name": name, "source": {"file": source, "test": test}, "description": description,
            "engine": eng, "requests": requests}


def scenarios() -> list[dict]:
    """The scenarios, in our own words (see each description)."""
    out = []
    for caching in (False, True):
        tag = "_apc" if caching else ""
        out.append(scenario(
            f"all_fit_first_step{tag}", SCHEDULER_TESTS, "test_schedule",
            "Ten 10-token prompts arrive together under the default budget: the first step admits all of them "
            "in arrival order with their whole prompts, then they decode together to 16 outputs.",
            engine(prefix_caching=caching), [req(i, 10) for i in range(10)]))
        out.append(scenario(
            f"long_prefill_cap_three_way{tag}", SCHEDULER_TESTS, "test_schedule_concurrent_partial_requests",
            "Three 800-token prompts, budget 1024, long_prefill_token_threshold 400: the first two get 400 "
            "each and the third the remaining 224; running prefills keep the cap, decodes join as prompts end.",
            engine(budget=1024, long_prefill=400, prefix_caching=caching), [req(i, 800) for i in range(3)]))
        out.append(scenario(
            f"staggered_arrivals_all_freed{tag}", SCHEDULER_TESTS, "test_memory_leak",
            "Five 10-token prompts (10 outputs each) arrive one per step; every block is back in the pool once "
            "the last one finishes.",
            engine(prefix_caching=caching), [req(i, 10, max_tokens=10, arrival_step=i + 1) for i in range(5)]))
    for chunked in (True, False):
        out.append(scenario(
            f"admission_order_{'chunked' if chunked else 'unchunked'}", SCHEDULER_TESTS, "test_schedule_order",
            "Two 800-token prompts then two 10-token prompts, budget 1024, max_num_seqs 3. "
            + ("With chunked prefill the second long prompt is cut to the remaining 224 tokens and nothing "
               "else fits; later the short ones wait for a max_num_seqs slot."
               if chunked else
               "Without chunked prefill the second long prompt does not fit the remaining budget and blocks "
               "the short ones behind it (no skipping ahead)."),
            engine(budget=1024, max_num_seqs=3, chunked_prefill=chunked),
            [req(1, 800), req(2, 800), req(3, 10), req(4, 10)]))
    out.append(scenario(
        "budget_leaves_one_waiting", SCHEDULER_TESTS, "test_scheduler_stats_waiting_queues",
        "Budget 100 and three 50-token prompts: two are admitted, the third waits for the next step. "
        "(vLLM's test also parks two requests in skipped_waiting by hand; that part is a KV-connector state "
        "and is left out.)",
        engine(budget=100), [req(i, 50) for i in range(3)]))
    out.append(scenario(
        "kv_gate_head_of_line", SCHEDULER_TESTS, "test_kv_connector_unable_to_allocate",
        "Block size 4, 10 blocks (9 usable), two 24-token prompts (6 blocks each), 2 outputs: only the first "
        "fits; the second waits until the first finishes and frees all its blocks. (vLLM's test adds an "
        "external KV hit of 8 tokens; here there is none.)",
        engine(block_size=4, num_blocks=10), [req(i, 24, max_tokens=2) for i in range(2)]))
    out.append(scenario(
        "preempt_tail_recompute", SCHEDULER_TESTS, "test_kv_connector_handles_preemption",
        "Block size 2, 7 blocks (6 usable), two 5-token prompts with 4 outputs: both start; when decoding "
        "needs a new block the later request is preempted (recompute), resumes once the first finishes, and "
        "all blocks return. (vLLM's test adds a 2-token external KV hit; here there is none.)",
        engine(block_size=2, num_blocks=7), [req(i, 5, max_tokens=4) for i in range(2)]))
    out.append(scenario(
        "one_seq_at_a_time", SCHEDULER_TESTS, "test_prepend_skipped_requests_order",
        "max_num_seqs 1 and four requests: they run strictly one after another and the waiting queue keeps "
        "its order. (vLLM's test parks the first two as waiting for remote KV; here none are.)",
        engine(max_num_seqs=1), [req(i, 10, max_tokens=3) for i in range(4)]))
    out.append(scenario(
        "decode_with_chunked_prefill", SCHEDULER_TESTS, "test_throttle_defers_inflight_prefill_chunk",
        "Budget 50: a 4-token request decodes while an 80-token prompt arriving at step 2 is prefilled in "
        "chunks next to it; max_model_len 256 so the prompt is admissible. (vLLM's test then throttles prefills for data-parallel balancing; not modelled.)",
        engine(budget=50, max_model_len=256), [req("dec0", 4, max_tokens=6), req("chk0", 80, max_tokens=3, arrival_step=2)]))
    out.append(scenario(
        "head_fills_budget", SCHEDULER_TESTS, "test_throttle_capacity_bound_guard_admits",
        "Budget 200 and two 200-token prompts: the first takes the whole budget, the second starts next step; "
        "max_model_len 1024 so a 200-token prompt leaves room for outputs. "
        "(vLLM's test then exercises the data-parallel prefill throttle; not modelled.)",
        engine(budget=200, max_model_len=1024), [req("a", 200, max_tokens=3), req("b", 200, max_tokens=3)]))
    out.append(scenario(
        "prefill_in_two_chunks", SCHEDULER_TESTS, "test_no_spec_tokens_scheduled_for_prefill_chunks",
        "Budget 50 and one 80-token prompt: 50 tokens, then the remaining 30, then decodes; max_model_len 256. (vLLM's test is "
        "about draft tokens, which are not modelled.)",
        engine(budget=50, max_model_len=256), [req(0, 80, max_tokens=4)]))
    # --- prefix caching (vLLM's KVCacheManager tests, driven through the scheduler)
    out.append(scenario(
        "apc_hit_in_use_then_free_then_evicted", PREFIX_TESTS, "test_prefill",
        "Block size 16, 11 blocks. Request 0 has three shared blocks plus 7 tokens; request 1 (three shared "
        "blocks plus 5) arrives while 0 still runs and hits 48 tokens; request 2 (shared blocks plus 6) "
        "arrives after both finished and hits 48 from the free-but-cached blocks; request 3 (160 fresh tokens) "
        "needs every block and evicts the cache.",
        engine(block_size=16, num_blocks=11, prefix_caching=True),
        [req(0, 55, 2, 1, [0, 1, 2]), req(1, 53, 2, 2, [0, 1, 2]), req(2, 54, 2, 4, [0, 1, 2]),
         req(3, 160, 1, 6)]))
    out.append(scenario(
        "apc_lru_keeps_touched_prefix", PREFIX_TESTS, "test_evict",
        "Block size 16, 11 blocks. Request 0 (five blocks plus 7 tokens) and request 1 (three blocks) finish; "
        "request 2 reuses the first two blocks of request 0 plus 3 tokens (hit 32); request 3 (8 fresh blocks) "
        "then forces evictions in LRU order; request 4 asks for request 0's first two blocks again.",
        engine(block_size=16, num_blocks=11, prefix_caching=True),
        [req(0, 87, 1, 1, [0, 1, 2, 3, 4]), req(1, 48, 1, 1, [10, 11, 12]), req(2, 35, 1, 2, [0, 1]),
         req(3, 128, 1, 3, [20, 21, 22, 23, 24, 25, 26, 27]), req(4, 40, 1, 4, [0, 1])]))
    out.append(scenario(
        "apc_hit_blocks_not_evicted_first", PREFIX_TESTS, "test_computed_blocks_not_evicted",
        "Block size 16, 3 blocks (2 usable). Requests 0 ([A]) and 1 ([B]) finish; request 2 ([A, C]) hits A "
        "and must take B's block for C rather than evict its own hit; request 3 ([B] plus 1) then misses.",
        engine(block_size=16, num_blocks=3, prefix_caching=True),
        [req(0, 16, 1, 1, [0]), req(1, 16, 1, 1, [1]), req(2, 32, 1, 2, [0, 2]), req(3, 17, 1, 3, [1])]))
    out.append(scenario(
        "apc_admission_counts_touched_hits", PREFIX_TESTS, "test_prefill_not_enough_free_blocks_with_computed_blocks",
        "Block size 16, 11 blocks. Request 0 ([C0 C1 C2]) keeps running; request 1 ([C0 C1 C2 E0 E1 E2]) hits "
        "48 and finishes, leaving E cached but free; request 2 ([D0 D1]) runs; request 3 ([C.. E.. F0 F1 F2]) "
        "hits 96 tokens but its admission needs the free cached E blocks as well as 3 new ones.",
        engine(block_size=16, num_blocks=11, prefix_caching=True),
        [req(0, 48, 8, 1, [0, 1, 2]), req(1, 96, 1, 2, [0, 1, 2, 3, 4, 5]), req(2, 32, 8, 3, [6, 7]),
         req(3, 144, 2, 4, [0, 1, 2, 3, 4, 5, 8, 9, 10])]))
    out.append(scenario(
        "no_hits_when_caching_off", PREFIX_TESTS, "test_basic_prefix_caching_disabled",
        "Prefix caching off, block size 4, 5 blocks (4 usable). Request 1 (10 tokens) finishes; request 2 "
        "(16 tokens, same leading content) gets no hit and takes all 4 blocks; request 3 (4 tokens, arriving "
        "with it) waits until request 2 finishes.",
        engine(block_size=4, num_blocks=5, prefix_caching=False),
        [req(1, 10, 1, 1, [0, 1]), req(2, 16, 1, 2, [0, 1, 2, 3]), req(3, 4, 1, 2, [0])]))
    out.append(scenario(
        "apc_identical_prompt_recomputes_last_token", SCHEDULER_TESTS, "test_spec_decode_padding_first_decode_step",
        "Block size 16. Two identical 33-token prompts (two full blocks plus one token): the second, arriving "
        "at step 2, hits 32 tokens and computes only the last one. (vLLM's test is about draft-token "
        "padding, which is not modelled; the hit rule is what remains.)",
        engine(block_size=16, prefix_caching=True),
        [req("r1", 33, 4, 1, [0, 1]), req("r2", 33, 4, 2, [0, 1])]))
    # --- our own scenarios (not in vLLM's tests)
    out.append(scenario(
        "max_model_len_finish", OURS, "max_model_len finish",
        "Prompt 60, max_model_len 64, 20 outputs wanted, block size 16: vLLM finishes the request with reason "
        "'length' when its length reaches max_model_len and frees its blocks.",
        engine(budget=2048, max_model_len=64), [req(0, 60, max_tokens=20)]))
    out.append(scenario(
        "lone_request_exemption", OURS, "long_prefill_token_threshold with one request",
        "Budget 1024, long_prefill_token_threshold 400: a lone 900-token prompt gets the whole budget (the "
        "cap protects other requests and there are none); a second 900-token prompt arriving at step 2 makes "
        "the cap apply to both.",
        engine(budget=1024, long_prefill=400), [req(0, 900, 3), req(1, 900, 3, arrival_step=2)]))
    out.append(scenario(
        "kv_gate_blocks_smaller_behind", OURS, "head-of-line blocking on KV blocks",
        "Block size 4, 10 blocks (9 usable): two 24-token prompts and a 4-token one. The second cannot get "
        "its 6 blocks, and the small one behind it is not tried although one block would do.",
        engine(block_size=4, num_blocks=10), [req(0, 24, 2), req(1, 24, 2), req(2, 4, 2)]))
    out.append(scenario(
        "preempt_two_from_tail", OURS, "several preemptions in one step",
        "Block size 2, 9 blocks (8 usable), budget 64, long_prefill_token_threshold 8: a 16-token prompt and "
        "two 4-token prompts fill the pool in step 1; the long prompt's next chunk needs 4 blocks, so both "
        "later requests are preempted (the last one first) and wait at the front in their original order.",
        engine(budget=64, block_size=2, num_blocks=9, long_prefill=8),
        [req(0, 16, 1), req(1, 4, 3), req(2, 4, 3)]))
    return out



def async_scenarios() -> list[dict]:
    """Scenarios whose outcome depends on async scheduling (recorded in async
    mode only; each must disagree with the kernel's synchronous rules)."""
    out = []
    for m in (1, 2, 3, 5):
        out.append(scenario(
            f"async_stop_by_max_tokens_{m}", ASYNC_TESTS, "test_stop_by_max_tokens",
            f"Two 10-token prompts with max_tokens {m}, the second arriving one step later: no step is scheduled "
            "past max_tokens although the last token is still in flight when the next plan is made (the "
            "prompt plus max_tokens - 1 tokens are scheduled per request, no more).",
            engine(), [req(0, 10, m), req(1, 10, m, arrival_step=2)]))
    out.append(scenario(
        "async_prefill_dedup", ASYNC_TESTS, "test_prefix_caching_for_prefill_dedup",
        "Budget 1000, block size 16, prefix caching: two 100-token prompts with the same six full blocks arrive "
        "together (the second hits 96 tokens registered by the first in the same step), then one more per "
        "step; each hits the blocks while their holders still have tokens in flight.",
        engine(budget=1000, prefix_caching=True),
        [req(0, 100, 3, 1, range(6)), req(1, 100, 3, 1, range(6))]
        + [req(i, 100, 3, i, range(6)) for i in (3, 4, 5)]))
    out.append(scenario(
        "async_finish_while_planning", OURS_ASYNC, "a finish applied after the next plan",
        "Block size 4, 10 blocks (9 usable): a 24-token prompt (3 outputs) holds 7 blocks; a 20-token prompt "
        "arriving at step 2 needs 5 more. The first one's last token is applied only after the next plan has "
        "been made, so its blocks come back one step later than in sync mode and the second starts later.",
        engine(block_size=4, num_blocks=10), [req(0, 24, 3), req(1, 20, 2, arrival_step=2)]))
    out.append(scenario(
        "async_preempt_in_flight", OURS_ASYNC, "preemption with a step in flight",
        "Block size 2, 7 blocks (6 usable), two 5-token prompts with 4 outputs: when the first needs a block "
        "the second is preempted while its own decode is still in flight; that stale token is still "
        "appended to it (it waits with one more output and recomputes it), its placeholders are reset.",
        engine(block_size=2, num_blocks=7), [req(0, 5, 4), req(1, 5, 4)]))
    out.append(scenario(
        "async_preempt_last_token_in_flight", OURS_ASYNC, "a preempted request finished by its stale token",
        "Block size 2, 7 blocks (6 usable): two 5-token prompts with 6 and 2 outputs. "
        "The second's last token is in flight (so it is not scheduled) when the first needs a block and "
        "preempts it from the tail; the stale token then finishes it in the waiting queue.",
        engine(block_size=2, num_blocks=7), [req(0, 5, 6), req(1, 5, 2)]))
    out.append(scenario(
        "async_max_model_len_in_flight", OURS_ASYNC, "max_model_len reached with a token in flight",
        "Prompt 60, max_model_len 64, 20 outputs wanted: the plan made while the last admissible token is in "
        "flight schedules nothing for it (max_model_len - computed - 1 = 0), and it finishes with 'length'.",
        engine(budget=2048, max_model_len=64), [req(0, 60, max_tokens=20), req(1, 10, 3, arrival_step=3)]))
    out.append(scenario(
        "async_chunked_prefill_no_placeholder", OURS_ASYNC, "prefill chunks carry no placeholder",
        "Budget 50: an 80-token prompt is prefilled in two chunks (no placeholder for the first chunk, one for "
        "the last) while a 4-token request decodes next to it with its token in flight.",
        engine(budget=50, max_model_len=256), [req("dec0", 4, max_tokens=6), req("chk0", 80, max_tokens=3)]))
    out.append(scenario(
        "async_seq_slot_freed_late", OURS_ASYNC, "max_num_seqs slot freed one step later",
        "max_num_seqs 1 and three requests: each one's slot is given back only when its last token is applied, "
        "after the next plan was made, so every admission comes a step later than in sync mode.",
        engine(max_num_seqs=1), [req(i, 10, max_tokens=2) for i in range(3)]))
    out.append(scenario(
        "async_apc_hit_after_finish", OURS_ASYNC, "prefix hit on blocks freed one step earlier",
        "Block size 16, 8 blocks (7 usable), prefix caching: request 0 ([A B C] plus 7) finishes; request 1 "
        "([A B C] plus 9) arrives as it finishes and request 2 (80 fresh tokens) with it: the plan made before "
        "0's last token is applied still sees 0's blocks held, so 1 hits them in use and 2 waits for blocks.",
        engine(block_size=16, num_blocks=8, prefix_caching=True),
        [req(0, 55, 2, 1, [0, 1, 2]), req(1, 57, 2, 3, [0, 1, 2]), req(2, 80, 2, 3)]))
    out.append(scenario(
        "async_arrivals_each_step", OURS_ASYNC, "arrivals while a step is in flight",
        "Budget 64, long_prefill_token_threshold 16: a 40-token prompt and three 20-token prompts arriving one "
        "per step; running prefills are planned from computed tokens that include the in-flight chunk.",
        engine(budget=64, long_prefill=16), [req(i, 40 if i == 0 else 20, 3, arrival_step=i + 1) for i in range(4)]))
    for caching in (False, True):
        out.append(scenario(
            f"async_mixed_pressure{'_apc' if caching else ''}", OURS_ASYNC, "many requests under KV pressure",
            "Sixteen requests (prompts 5-60 tokens, 1-12 outputs, arriving over 12 steps; with prefix caching "
            "half of them share leading blocks) on block size 4, 40 blocks, budget 48, max_num_seqs 6, "
            "long_prefill_token_threshold 16: preemptions with steps in flight, finishes applied after the next "
            "plan and hits on blocks of requests that just finished, all at once.",
            engine(budget=48, max_num_seqs=6, block_size=4, num_blocks=40, long_prefill=16, max_model_len=256,
                   prefix_caching=caching),
            mixed_requests(16, caching)))
    return out


def mixed_requests(n: int, shared: bool) -> list[dict]:
    """``n`` requests of varied lengths and arrivals from a fixed seed (the
    same list every run); with ``shared`` every other one starts with one
    of two common block prefixes."""
    import random

    rng = random.Random(27)
    out = []
    for i in range(n):
        prompt, outputs, arrival = rng.randint(5, 60), rng.randint(1, 12), rng.randint(1, 12)
        blocks = None
        if shared and i % 2 == 0:
            blocks = [100 * (i % 4) + b for b in range(min(prompt // 4, rng.randint(1, 6)))]
        out.append(req(i, prompt, outputs, arrival, blocks))
    return sorted(out, key=lambda r: r["arrival_step"])


RANDOM_SOURCE = "latroute (random async)"
RANDOM_SEED = 48
RANDOM_COUNT = 240


def random_async_scenarios(count: int = RANDOM_COUNT, seed: int = RANDOM_SEED) -> list[dict]:
    """``count`` seeded random scenarios for async mode (the same list every
    run): arrivals at every step, prompts around and above the token budget,
    1-40 outputs, KV pools small enough to force preemptions, prefix caching
    with shared prefixes in two of three, max_model_len and max_num_seqs
    limits. Scenario ``i`` draws from its own generator (seeded by ``seed``
    and ``i``), so adding scenarios leaves the earlier ones as they were."""
    import random

    return [_random_scenario(random.Random(seed * 1_000_003 + i), f"rand_{i:03d}") for i in range(count)]


def _random_scenario(rng, name: str) -> dict:
    block = rng.choice((2, 4, 8, 16))
    budget = rng.randint(16, 96)
    chunked = rng.random() < 0.85
    caching = rng.random() < 2 / 3
    n = rng.randint(6, 18)
    prompts = [rng.randint(budget // 2, budget * 5 // 2) if rng.random() < 0.7 else rng.randint(1, max(1, budget // 2))
               for _ in range(n)]
    outputs = [rng.randint(1, 40) for _ in range(n)]
    # max_model_len: tight (a few requests stop with 'length') or roomy; without
    # chunked prefill vLLM needs the budget to cover it, so prompts shrink to fit
    if chunked:
        max_len = max(prompts) + rng.choice((1, 8, 20, 200))
    else:
        max_len = budget
        prompts = [min(p, budget - 1 - rng.randint(0, 3)) for p in prompts]
        prompts = [max(1, p) for p in prompts]
    long_prefill = rng.choice((0, 0, budget // 4, budget // 2)) if chunked else 0
    # the pool: the largest request fits alone, the whole load does not
    held = [-(-min(p + t, max_len) // block) for p, t in zip(prompts, outputs)]
    usable = max(max(held), round(sum(held) * rng.uniform(0.15, 0.6)))
    max_num_seqs = rng.choice((1, 2, 3, 4, 6, 8, 16))
    families = [[1000 * f + j for j in range(rng.randint(1, 8))] for f in range(rng.randint(1, 3))]
    per_step = rng.choice((1, 1, 2))
    requests = []
    for i, (p, t) in enumerate(zip(prompts, outputs)):
        blocks = None
        if caching and rng.random() < 0.75:
            fam = rng.choice(families)
            k = min(len(fam), p // block)
            blocks = fam[:rng.randint(min(1, k), k)] if k else []
        requests.append(req(i, p, t, 1 + i // per_step, blocks))
    eng = engine(budget=budget, max_num_seqs=max_num_seqs, block_size=block, num_blocks=usable + 1,
                 long_prefill=long_prefill, max_model_len=max_len, prefix_caching=caching, chunked_prefill=chunked)
    return scenario(name, RANDOM_SOURCE, "random async scenario",
                    f"{n} requests, {per_step} per step; budget {budget}, block size {block}, {usable} usable "
                    f"blocks, max_num_seqs {max_num_seqs}, max_model_len {max_len}"
                    f"{', long_prefill ' + str(long_prefill) if long_prefill else ''}"
                    f"{', prefix caching' if caching else ''}{'' if chunked else ', chunked prefill off'}.",
                    eng, requests)


PRIORITY_SOURCE = "latroute (priority)"


def preq(rid, prompt, max_tokens=16, arrival_step=1, priority=0, blocks=None):
    """A request under priority scheduling (vLLM's ``Request.priority``,
    lower first)."""
    return {**req(rid, prompt, max_tokens, arrival_step, blocks), "priority": priority}


def priority_engine(**kw):
    """``engine`` under vLLM's ``--scheduling-policy priority``."""
    return {**engine(**kw), "scheduling_policy": "priority"}


def priority_scenarios() -> list[dict]:
    """Scenarios under vLLM's priority scheduling policy (recorded sync and
    async, kept in their own folder, ``priority/``): waiting ordered by
    (priority, arrival time, request id), a preempted request put back at its
    place in that order, and the preemption victim the running request with
    the largest (priority, arrival time), the first in running order among
    equals. A request's arrival time is its arrival step."""
    def sc(name, description, eng, requests):
        return scenario(name, PRIORITY_SOURCE, name, description, eng, requests)

    out = [
        sc("prio_waiting_order", "max_num_seqs 1, six 10-token requests arriving together with priorities "
           "3 1 2 0 1 2: admitted one at a time by priority, ties by request id.",
           priority_engine(max_num_seqs=1), [preq(i, 10, 2, 1, p) for i, p in enumerate((3, 1, 2, 0, 1, 2))]),
        sc("prio_late_arrival_jumps_queue", "max_num_seqs 1: three priority-5 requests arrive at step 1, a "
           "priority-0 one at step 3; it runs next, ahead of the two that waited longer.",
           priority_engine(max_num_seqs=1),
           [preq(0, 10, 4, 1, 5), preq(1, 10, 4, 1, 5), preq(2, 10, 4, 1, 5), preq(3, 10, 4, 3, 0)]),
        sc("prio_tie_arrival_before_id", "max_num_seqs 1, every request priority 1: '9' runs from step 1; '5' "
           "and '7' arrive at step 2, '3' at step 3: ties go by arrival time first ('5', '7', then '3', whose "
           "id is the smallest), then by id.",
           priority_engine(max_num_seqs=1),
           [preq(9, 10, 6, 1, 1), preq(7, 10, 3, 2, 1), preq(5, 10, 3, 2, 1), preq(3, 10, 3, 3, 1)]),
        sc("prio_tie_same_step_by_id", "max_num_seqs 2, four priority-0 requests arriving together, listed "
           "c a d b: they run in request-id order a b c d, not in the order they were added.",
           priority_engine(max_num_seqs=2), [preq(r, 10, 3, 1, 0) for r in "cadb"]),
        sc("prio_preempt_lowest_not_tail", "Block size 2, 11 blocks: a priority-9 request admitted first, two "
           "priority-0 ones after it; when a block runs out the victim is the priority-9 request at the head "
           "of running (already in the step's batch: it leaves the batch and its tokens go back to the "
           "budget), not the tail.",
           priority_engine(block_size=2, num_blocks=11),
           [preq(0, 5, 6, 1, 9), preq(1, 5, 6, 2, 0), preq(2, 5, 6, 2, 0)]),
        sc("prio_preempt_self", "Block size 4, 5 blocks: a priority-5 request admitted at step 1, a priority-0 "
           "one at step 2; when the first (head of running) needs a block it is itself the victim: it "
           "preempts itself and the pass stops before the second (an empty step).",
           priority_engine(block_size=4, num_blocks=5), [preq(0, 7, 10, 1, 5), preq(1, 6, 10, 2, 0)]),
        sc("prio_victim_tie_first_in_running", "Block size 2, 9 blocks: two priority-0 requests arriving "
           "together decode until a block runs out: the victim is the first of the two in running "
           "(max over equal keys), not the tail.",
           priority_engine(block_size=2, num_blocks=9), [preq(0, 5, 8, 1, 0), preq(1, 5, 8, 1, 0)]),
        sc("prio_preempted_behind_higher_waiting", "Block size 2, 11 blocks, max_num_seqs 2: two priority-1 "
           "requests run while a priority-0 one that arrived later waits for a seat; the priority-1 request "
           "preempted under KV pressure goes back behind it, not to the front.",
           priority_engine(block_size=2, num_blocks=11, max_num_seqs=2),
           [preq(0, 5, 8, 1, 1), preq(1, 5, 8, 2, 1), preq(2, 5, 3, 3, 0)]),
        sc("prio_preempted_high_returns_first", "Block size 2, 11 blocks, max_num_seqs 2: two priority-0 "
           "requests run, a priority-3 one arrived first but waits; the later priority-0 request, preempted, "
           "goes back ahead of it and is readmitted first.",
           priority_engine(block_size=2, num_blocks=11, max_num_seqs=2),
           [preq(0, 5, 8, 2, 0), preq(1, 5, 8, 3, 0), preq(2, 5, 3, 1, 3)]),
        sc("prio_max_num_seqs_pressure", "max_num_seqs 2, eight requests of priorities 0-3 arriving over six "
           "steps: every freed seat goes to the best waiting request.",
           priority_engine(max_num_seqs=2),
           [preq(i, 8 + 3 * i, 2 + i % 3, 1 + i * 3 // 4, (5 * i + 2) % 4) for i in range(8)]),
        sc("prio_long_prefill_chunked", "Budget 64, long_prefill_token_threshold 16: two priority-5 prompts of "
           "100 tokens are prefilled in chunks; priority-0 short requests arriving meanwhile are admitted "
           "first among the waiting (ahead of a priority-2 one added before them), with what budget the "
           "running requests leave.",
           priority_engine(budget=64, long_prefill=16, max_model_len=256),
           [preq(0, 100, 3, 1, 5), preq(1, 100, 3, 1, 5), preq(4, 40, 3, 2, 2), preq(2, 12, 3, 2, 0),
            preq(3, 12, 3, 3, 0)]),
        sc("prio_unchunked_budget", "Chunked prefill off, budget 128: the best waiting prompt (100 tokens) "
           "does not fit the budget left, so the pass stops there although a smaller, worse one would fit.",
           priority_engine(budget=128, chunked_prefill=False),
           [preq(0, 60, 4, 1, 2), preq(1, 100, 4, 1, 0), preq(2, 20, 4, 1, 3), preq(3, 30, 4, 2, 1)]),
        sc("prio_kv_gate_head", "Block size 4, 16 blocks: the best waiting request needs more blocks than are "
           "free, and the smaller, worse ones behind it wait too (no one behind the head is tried), although one "
           "was added before it.",
           priority_engine(block_size=4, num_blocks=16),
           [preq(0, 30, 6, 1, 1), preq(2, 4, 3, 2, 4), preq(1, 40, 3, 2, 0), preq(3, 4, 3, 3, 4)]),
        sc("prio_negative_and_large", "max_num_seqs 2: priorities -5, 100, 0 and -5 again (a later arrival), "
           "and 7: negative priorities run first, the two -5 ones by arrival.",
           priority_engine(max_num_seqs=2),
           [preq(0, 10, 3, 1, 100), preq(1, 10, 3, 1, -5), preq(2, 10, 3, 1, 0), preq(3, 10, 3, 2, -5),
            preq(4, 10, 3, 2, 7)]),
        sc("prio_apc_shared_prefix", "Prefix caching, block size 16, max_num_seqs 1: requests sharing the "
           "blocks [A B C] or [A D] run by priority; each hits what the ones before it left cached.",
           priority_engine(max_num_seqs=1, prefix_caching=True),
           [preq(0, 60, 2, 1, 2, [0, 1, 2]), preq(1, 40, 2, 1, 0, [0, 3]), preq(2, 55, 2, 1, 1, [0, 1, 2]),
            preq(3, 70, 2, 2, 0, [0, 1, 2])]),
        sc("prio_apc_preempt_pressure", "Prefix caching, block size 4, 11 blocks: three requests sharing "
           "leading blocks with priorities 2, 0 and 1 grow until blocks run out; the priority-2 one is the "
           "victim and hits its own cached blocks when readmitted.",
           priority_engine(block_size=4, num_blocks=11, prefix_caching=True),
           [preq(0, 10, 8, 1, 2, [0, 1]), preq(1, 10, 8, 1, 0, [0, 1]), preq(2, 9, 8, 2, 1, [0])]),
    ]
    for caching in (False, True):
        prios = [(7 * i + 3) % 5 for i in range(16)]
        out.append(sc(
            f"prio_mixed_pressure{'_apc' if caching else ''}",
            "The sixteen requests of async_mixed_pressure with priorities 0-4 (block size 4, 40 blocks, budget "
            "48, max_num_seqs 6, long_prefill_token_threshold 16): preemptions by priority, victims already in "
            "the batch, readmissions by priority, all at once.",
            priority_engine(budget=48, max_num_seqs=6, block_size=4, num_blocks=40, long_prefill=16,
                            max_model_len=256, prefix_caching=caching),
            [{**r, "priority": prios[int(r["id"])]} for r in mixed_requests(16, caching)]))
    return out
