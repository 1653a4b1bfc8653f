"""A small pure-Python transcription of vLLM 0.32's ``BlockPool`` (full
attention, block size = hash block size), written independently of
``estimators.engine.block_pool`` to check it: lists and dicts, no cleverness.

vLLM source it follows: ``block_pool.py`` (``BlockHashToBlockMap``,
``get_new_blocks``, ``touch``, ``free_blocks``, ``cache_full_blocks``),
``kv_cache_utils.FreeKVCacheBlockQueue``, ``single_type_kv_cache_manager``
(``find_longest_cache_hit``, ``free`` = reversed blocks).
"""
from __future__ import annotations


class RefBlockPool:
    def __init__(self, num_blocks: int):
        self.ref = [0] * num_blocks
        self.hash: list[int | None] = [None] * num_blocks
        self.free_queue = list(range(num_blocks))
        self.free_queue.pop(0)  # the null block
        self.map: dict[int, dict[int, None]] = {}  # hash -> blocks in insertion order
        self.evictions = 0

    def num_free(self) -> int:
        return len(self.free_queue)

    def get_cached_block(self, h: int) -> int | None:
        blocks = self.map.get(h)
        return next(iter(blocks)) if blocks else None

    def find_hit(self, hashes: list[int], num_tokens: int, block_size: int) -> list[int]:
        out = []
        for h in hashes[: (num_tokens - 1) // block_size]:
            b = self.get_cached_block(h)
            if b is None:
                break
            out.append(b)
        return out

    def touch(self, blocks: list[int]) -> None:
        for b in blocks:
            if self.ref[b] == 0:
                self.free_queue.remove(b)
            self.ref[b] += 1

    def get_new_blocks(self, n: int) -> list[int]:
        assert n <= len(self.free_queue)
        out, self.free_queue = self.free_queue[:n], self.free_queue[n:]
        for b in out:
            h = self.hash[b]
            if h is not None:
                del self.map[h][b]
                if not self.map[h]:
                    del self.map[h]
                self.hash[b] = None
                self.evictions += 1
            assert self.ref[b] == 0
            self.ref[b] = 1
        return out

    def cache_full_blocks(self, blocks: list[int], hashes: list[int], n_cached: int, n_full: int) -> None:
        for i in range(n_cached, n_full):
            b = blocks[i]
            assert self.hash[b] is None
            self.hash[b] = hashes[i]
            self.map.setdefault(hashes[i], {})[b] = None

    def free_blocks(self, ordered: list[int]) -> None:
        first, last = [], []
        for b in ordered:
            self.ref[b] -= 1
            if self.ref[b] == 0:
                (first if self.hash[b] is None else last).append(b)
        self.free_queue = first + self.free_queue + last
