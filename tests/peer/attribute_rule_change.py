"""Attribute a difference between two vLLM releases' peer records to one
rule change: run the generator under the older release with only that
change of the newer release patched in, and compare with the newer
release's records (``diff -r``). When they are identical, that change alone
explains every record the two releases disagree on.

Why: ``releases.MOVED`` names the change behind each record that
differs from the kernel; reading the diff of vLLM's sources narrows it down,
this shows it. Run from the repository root with the older release's
interpreter; the options after ``--since`` are the generator's:

    $LATROUTE_VLLM_PYTHON_0_30_0 tests/peer/attribute_rule_change.py --since 0.31.0 --out /tmp/patched
    diff -r /tmp/patched tests/peer/fixtures/0.31.0   # only the vllm_version lines differ

(``async_random.jsonl.gz`` is compressed: compare it with ``zcat``.)

``--since 0.24.0`` (run under 0.19.x .. 0.23.x): ``BlockPool.free_blocks``
puts the freed blocks without a block hash at the head of the free queue
and the rest at its tail, as from vLLM 0.24.0 on. ``--since 0.31.0`` (run
under 0.30.x or older): ``long_prefill_token_threshold`` is not applied
while at most one request is running or waiting, as from vLLM 0.31.0 on.
"""
from __future__ import annotations

import sys


def free_queue_order_of_0_24() -> None:
    """vLLM 0.24.0's ``BlockPool.free_blocks`` (and the free queue's
    ``prepend_n`` it needs, which older releases lack)."""
    from vllm.v1.core.block_pool import BlockPool
    from vllm.v1.core.kv_cache_utils import FreeKVCacheBlockQueue

    def prepend_n(self, blocks):
        if not blocks:
            return
        first, prev = self.fake_free_list_head.next_free_block, self.fake_free_list_head
        for block in blocks:
            block.prev_free_block, prev.next_free_block, prev = prev, block, block
        prev.next_free_block, first.prev_free_block = first, prev
        self.num_free_blocks += len(blocks)

    def free_blocks(self, ordered_blocks):
        hashed, unhashed = [], []
        for block in ordered_blocks:
            block.ref_cnt -= 1
            if block.ref_cnt == 0 and not block.is_null:
                (unhashed if block.block_hash is None else hashed).append(block)
        self.free_block_queue.prepend_n(unhashed)
        self.free_block_queue.append_n(hashed)

    if not hasattr(FreeKVCacheBlockQueue, "prepend_n"):
        FreeKVCacheBlockQueue.prepend_n = prepend_n
    BlockPool.free_blocks = free_blocks


def lone_request_exemption_of_0_31() -> None:
    """vLLM 0.31.0's exemption of a lone request from
    ``long_prefill_token_threshold`` (its adaptive floor is off by default)."""
    from vllm.v1.core.sched.scheduler import Scheduler

    original = Scheduler.schedule

    def schedule(self, *args, **kwargs):
        config = self.scheduler_config
        threshold = config.long_prefill_token_threshold
        if len(self.running) + len(self.waiting) + len(getattr(self, "skipped_waiting", ())) <= 1:
            config.long_prefill_token_threshold = 0
        try:
            return original(self, *args, **kwargs)
        finally:
            config.long_prefill_token_threshold = threshold

    Scheduler.schedule = schedule


CHANGES = {"0.24.0": free_queue_order_of_0_24, "0.31.0": lone_request_exemption_of_0_31}


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] != "--since" or argv[1] not in CHANGES:
        print(f"error: --since: one of {', '.join(CHANGES)} first, then the generator's options", file=sys.stderr)
        return 2
    if "--out" not in argv:  # the default folder holds the release's own records, which a patched run must not touch
        print("error: --out is required (a folder other than the release's own records)", file=sys.stderr)
        return 2
    CHANGES[argv[1]]()
    import generate_fixtures  # beside this script: run by path

    return generate_fixtures.main(argv[2:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
