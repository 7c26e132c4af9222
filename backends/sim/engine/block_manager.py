"""KV-cache blocks with a capacity and prefix caching by chained block hashes.

A block holds block_size tokens. A full block gets a hash of (previous block's hash,
its tokens); a later sequence whose prompt starts with the same blocks reuses them and
skips their prefill. Freed blocks keep their hash until they are handed out again
(least recently freed first), so a repeated prefix hits even after the first user left.

With `record_events`, the cache's changes are kept as vLLM's KV-cache events (common/kv_events.py):
BlockStored for each run of newly cached blocks (their hashes, the hash before them, their token
ids), BlockRemoved for a cached block handed out again; `take_events` empties the list (one batch
per step, as vLLM publishes). The hashes are the sim's own (Python's, as 64-bit unsigned).
"""

from __future__ import annotations

from collections import OrderedDict

from backends.sim.engine.sequence import Sequence
from common.kv_events import MEDIUM_GPU, BlockRemoved, BlockStored, KvEvent

MASK64 = (1 << 64) - 1


class BlockManager:
    def __init__(
        self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True, record_events: bool = False
    ) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_count = [0] * num_blocks
        self.block_hash: list[int | None] = [None] * num_blocks
        self.free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self.cached: dict[int, int] = {}  # hash -> block id
        self.num_queries = 0
        self.num_hits = 0
        self.events: list[KvEvent] | None = [] if record_events and enable_prefix_caching else None

    def take_events(self) -> list[KvEvent]:
        """The cache's changes since the last call (none without record_events)."""
        if not self.events:
            return []
        events, self.events = self.events, []
        return events

    @property
    def num_free(self) -> int:
        return len(self.free)

    @property
    def usage(self) -> float:
        return 1.0 - len(self.free) / self.num_blocks

    def blocks_needed(self, seq: Sequence, num_new_tokens: int) -> int:
        total = -(-(seq.num_computed_tokens + num_new_tokens) // self.block_size)
        return max(0, total - len(seq.block_table))

    def can_allocate(self, seq: Sequence, num_new_tokens: int) -> bool:
        return self.blocks_needed(seq, num_new_tokens) <= len(self.free)

    def _chain_hashes(self, token_ids: list[int], start: int, stop: int, prev: int = 0) -> list[int]:
        hashes, size = [], self.block_size
        for i in range(start, stop):
            prev = hash((prev, *token_ids[i * size : (i + 1) * size]))
            hashes.append(prev)
        return hashes

    def match_prefix(self, seq: Sequence) -> list[int]:
        """Cached blocks that hold this sequence's leading tokens. At least one token
        is always left to compute (its logits give the next token)."""
        if not self.enable_prefix_caching or seq.block_table:
            return []
        num_full = (seq.num_tokens - 1) // self.block_size
        hits: list[int] = []
        for h in self._chain_hashes(seq.token_ids, 0, num_full):
            block = self.cached.get(h)
            if block is None:
                break
            hits.append(block)
        return hits

    def take_prefix(self, seq: Sequence, blocks: list[int]) -> None:
        """Give a waiting sequence its cached prefix blocks: they count as computed. The
        hit-rate counters count it here, at admission, and not for a preempted sequence coming
        back (as vLLM: a lookup that is not scheduled, or a re-admission, is not a query)."""
        if self.enable_prefix_caching and seq.num_preemptions == 0:
            self.num_queries += seq.num_tokens
            self.num_hits += len(blocks) * self.block_size
        for block in blocks:
            if self.ref_count[block] == 0:
                del self.free[block]
            self.ref_count[block] += 1
        seq.block_table.extend(blocks)
        seq.num_computed_tokens = len(blocks) * self.block_size
        seq.num_cached_tokens = max(seq.num_cached_tokens, seq.num_computed_tokens)
        if blocks:
            seq.num_hashed_blocks = len(blocks)
            seq.last_block_hash = self.block_hash[blocks[-1]] or 0

    def allocate(self, seq: Sequence, num_new_tokens: int) -> None:
        for _ in range(self.blocks_needed(seq, num_new_tokens)):
            block, _ = self.free.popitem(last=False)
            old = self.block_hash[block]
            if old is not None:
                if self.cached.get(old) == block:
                    del self.cached[old]
                    if self.events is not None:
                        self.events.append(BlockRemoved([old & MASK64], MEDIUM_GPU))
                self.block_hash[block] = None
            self.ref_count[block] = 1
            seq.block_table.append(block)

    def on_computed(self, seq: Sequence) -> None:
        """Hash the blocks that this step filled with computed tokens."""
        if not self.enable_prefix_caching:
            return
        done, prev = seq.num_hashed_blocks, seq.last_block_hash
        full = min(seq.num_computed_tokens // self.block_size, len(seq.block_table))
        if full <= done:
            return
        hashes = self._chain_hashes(seq.token_ids, done, full, prev)
        stored: list[int] = []  # the positions of the blocks newly cached
        for i, h in enumerate(hashes, start=done):
            block = seq.block_table[i]
            if self.block_hash[block] is None:
                self.block_hash[block] = h
                if self.cached.setdefault(h, block) == block:
                    stored.append(i)
        if self.events is not None and stored:
            self._stored(seq, stored, prev, hashes, done)
        seq.num_hashed_blocks, seq.last_block_hash = full, hashes[-1]

    def _stored(self, seq: Sequence, positions: list[int], prev: int, hashes: list[int], done: int) -> None:
        """One BlockStored per run of consecutive newly cached blocks."""
        assert self.events is not None
        size, runs = self.block_size, [[positions[0]]]
        for i in positions[1:]:
            if i == runs[-1][-1] + 1:
                runs[-1].append(i)
            else:
                runs.append([i])
        for run in runs:
            first, last = run[0], run[-1]
            parent = (hashes[first - done - 1] if first > done else prev) if first > 0 else None
            self.events.append(
                BlockStored(
                    [hashes[i - done] & MASK64 for i in run],
                    None if parent is None else parent & MASK64,
                    seq.token_ids[first * size : (last + 1) * size],
                    size,
                    None,
                    MEDIUM_GPU,
                    None,
                )
            )

    def release(self, seq: Sequence) -> None:
        """Free a sequence's blocks (finished, aborted or preempted). Hashed blocks stay
        findable until reused; the last blocks freed are handed out last."""
        for block in reversed(seq.block_table):
            self.ref_count[block] -= 1
            if self.ref_count[block] == 0:
                self.free[block] = None
        seq.block_table = []
        seq.num_hashed_blocks = seq.last_block_hash = 0
