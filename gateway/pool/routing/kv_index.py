"""What each engine's KV cache holds, as its KV-cache events say (common/kv_events.py). Pure.

The engines' own block hashes depend on their hash function and seed (vLLM: SHA-256 of pickled
token ids from a fixed seed, or xxhash from a random one; the sim: Python's), so the index does not
try to compute them. It keys every block by its own chained hash of the token ids the BlockStored
event carries (`chain`, the same function the policy applies to a prompt's token ids), and keeps
per engine a map from the engine's hash to its own, which BlockRemoved and a later BlockStored's
parent are read through. A block whose parent it never saw (events missed before a replay) cannot
be placed in a chain and is counted in `num_unplaced`; blocks with extra keys (LoRA, multimodal,
cache salt) or in another medium than the GPU are left out: their tokens alone do not name them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

from common.kv_events import MEDIUM_GPU, AllBlocksCleared, BlockRemoved, BlockStored, KvEvent

ROOT = 0  # the chain's value before the first block


def chain(token_ids: Sequence[int], block_size: int, max_blocks: int, parent: int = ROOT) -> list[int]:
    """One hash per full block (at most max_blocks); hash k covers blocks 0..k. Python's hash of a
    tuple of ints is not seeded: the same in every process."""
    hashes: list[int] = []
    for i in range(min(len(token_ids) // block_size, max_blocks)):
        parent = hash((parent, *token_ids[i * block_size : (i + 1) * block_size]))
        hashes.append(parent)
    return hashes


class EngineBlocks:
    """One engine's cached blocks: its hash -> ours, and how many of its blocks hold each of ours."""

    def __init__(self) -> None:
        self.ours: dict[int | bytes, int] = {}
        self.held: Counter[int] = Counter()
        self.block_size = 0  # 0 until a BlockStored says it
        self.num_unplaced = 0

    def __len__(self) -> int:
        return len(self.held)

    def stored(self, event: BlockStored) -> None:
        if event.medium not in (None, MEDIUM_GPU) or event.lora_name is not None or event.lora_id is not None:
            return
        if event.extra_keys and any(k is not None for k in event.extra_keys):
            return
        parent = ROOT
        if event.parent_block_hash is not None:
            found = self.ours.get(event.parent_block_hash)
            if found is None:
                self.num_unplaced += len(event.block_hashes)
                return
            parent = found
        self.block_size = event.block_size
        hashes = chain(event.token_ids, event.block_size, len(event.block_hashes), parent)
        for theirs, own in zip(event.block_hashes, hashes, strict=False):
            if theirs not in self.ours:
                self.ours[theirs] = own
                self.held[own] += 1

    def removed(self, event: BlockRemoved) -> None:
        if event.medium not in (None, MEDIUM_GPU):
            return
        for theirs in event.block_hashes:
            own = self.ours.pop(theirs, None)
            if own is not None:
                self.held[own] -= 1
                if self.held[own] <= 0:
                    del self.held[own]

    def clear(self) -> None:
        self.ours.clear()
        self.held.clear()

    def match(self, hashes: Sequence[int]) -> int:
        """How many leading blocks it holds (chained: the first miss ends the match)."""
        held = self.held
        for i, h in enumerate(hashes):
            if h not in held:
                return i
        return len(hashes)


class KvIndex:
    """Every engine's blocks, by engine URL."""

    def __init__(self) -> None:
        self.engines: dict[str, EngineBlocks] = {}

    def engine(self, url: str) -> EngineBlocks:
        found = self.engines.get(url)
        if found is None:
            found = self.engines[url] = EngineBlocks()
        return found

    def apply(self, url: str, events: Iterable[KvEvent]) -> None:
        blocks = self.engine(url)
        for event in events:
            if isinstance(event, BlockStored):
                blocks.stored(event)
            elif isinstance(event, BlockRemoved):
                blocks.removed(event)
            elif isinstance(event, AllBlocksCleared):
                blocks.clear()

    def forget(self, url: str) -> None:
        """The engine restarted or is gone: its cache is empty (a restarted engine's events say the rest)."""
        found = self.engines.get(url)
        if found is not None:
            found.clear()

    def block_size(self) -> int:
        """The block size the engines' events gave (0: none yet)."""
        return max((e.block_size for e in self.engines.values()), default=0)

    def match(self, url: str, hashes: Sequence[int]) -> int:
        found = self.engines.get(url)
        return 0 if found is None else found.match(hashes)
