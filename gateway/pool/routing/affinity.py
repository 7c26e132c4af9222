"""routing = "cache_aware_local": per-process prefix tables with a hard load bound. Pure, no I/O.

Per backend, a bounded LRU of the prompt-block hashes recently routed there (what its
prefix cache probably holds). A request goes to the backend whose table matches the
most leading blocks, unless that backend's load exceeds the least-loaded candidate's by
more than both bounds (`balance_abs` and `balance_rel`, SGLang's two thresholds); then,
and when nothing matches, it goes to the least-loaded candidate. The prefix is recorded
wherever the request goes, so a hot prefix spreads to a second backend once the first is
full. Candidates are the caller's choice: unhealthy or ejected backends are not passed,
so they never match.

Each process learns alone: with --workers N or several pods, each sees 1/N of the traffic
and a prefix may settle on a different backend in each (cache_aware, rendezvous.py, does not).
"""

from __future__ import annotations

import sys
from collections import OrderedDict
from collections.abc import Sequence

from common.config.routing import CacheAwareSection
from gateway.pool.routing.policy import AFFINITY, BALANCE, NO_MATCH, REASONS, B, Candidate, Route, RoutingPolicy
from gateway.pool.routing.prefix import Prompt

__all__ = ["AFFINITY", "BALANCE", "NO_MATCH", "REASONS", "BlockLru", "PrefixAffinity", "Route"]
HASH_BYTES = sys.getsizeof(2**62)  # a 64-bit hash as a Python int


class BlockLru:
    """Block hashes, least recently routed first, at most `capacity` of them."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._entries: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, block: int) -> bool:
        return block in self._entries

    def match(self, hashes: Sequence[int]) -> int:
        """How many leading blocks are here (chained hashes: the first miss ends the match)."""
        entries = self._entries
        for i, block in enumerate(hashes):
            if block not in entries:
                return i
        return len(hashes)

    def record(self, hashes: Sequence[int]) -> None:
        """Mark the blocks as just routed here. The last block is touched first, so the
        leading blocks (shared by more requests) are evicted last, as an engine does."""
        entries = self._entries
        for block in reversed(hashes):
            if block in entries:
                entries.move_to_end(block)
            else:
                entries[block] = None
        while len(entries) > self.capacity:
            entries.popitem(last=False)

    def clear(self) -> None:
        self._entries.clear()

    def memory_bytes(self) -> int:
        """The table's own size plus its hash objects."""
        return sys.getsizeof(self._entries) + len(self._entries) * HASH_BYTES


class PrefixAffinity(RoutingPolicy):
    """The block tables of one model pool's backends, and the routing decision."""

    name = "cache_aware_local"
    reads_prompt = True
    by_prefix = True
    keeps_tables = True

    def __init__(self, settings: CacheAwareSection) -> None:
        self.settings = settings
        self.tables: dict[str, BlockLru] = {}

    def table(self, name: str) -> BlockLru:
        found = self.tables.get(name)
        if found is None:
            found = self.tables[name] = BlockLru(self.settings.max_blocks_per_backend)
        return found

    def forget(self, name: str) -> None:
        """The backend restarted or went down: its cache is gone."""
        table = self.tables.get(name)
        if table is not None:
            table.clear()

    def overloaded(self, load: float, least: float) -> bool:
        s = self.settings
        return load - least > s.balance_abs and load > least * s.balance_rel

    def route(self, candidates: Sequence[B], prompt: Prompt | None) -> Route[B] | None:
        return self.decide(candidates, prompt.blocks() if prompt is not None else [])

    def decide(self, candidates: Sequence[B], hashes: Sequence[int]) -> Route[B] | None:
        """Where this request goes; candidates in tie-break order (the first wins a tie)."""
        if not candidates:
            return None
        least = min(candidates, key=_load)
        best, num_best = least, 0
        if hashes:
            for c in candidates:
                n = self.table(c.name).match(hashes)
                if n > num_best or (n == num_best and n > 0 and c.load() < best.load()):
                    best, num_best = c, n
        if num_best == 0:
            chosen, reason = least, NO_MATCH
        elif best is least or not self.overloaded(best.load(), least.load()):
            chosen, reason = best, AFFINITY
        else:
            chosen, reason, num_best = least, BALANCE, self.table(least.name).match(hashes)
        if hashes:
            self.table(chosen.name).record(hashes)
        return Route(chosen, reason, num_best, len(hashes))

    def table_sizes(self) -> dict[str, tuple[int, int]]:
        return {name: (len(table), table.memory_bytes()) for name, table in self.tables.items()}


def _load(c: Candidate) -> int:
    return c.load()
