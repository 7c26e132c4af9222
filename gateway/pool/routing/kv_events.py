"""routing = "kv_events": cache_aware (rendezvous.py) that also knows what each engine's KV cache
holds, from the engines' KV-cache events (kv_index.py, fed by gateway/pool/kv_listener.py in
every process). Pure, no I/O.

Per request: the prompt's token ids as the engine computes them (tokens.py), cut into the engines'
blocks (the block size their events give) and chained as the index keys them; each candidate's
match is how many leading blocks its cache holds. Candidates are tried longest match first; among
several that hold the longest match, when it covers the prompt's first `key_blocks` blocks, the
least loaded first (a hot prefix held by every engine spreads by load at no cost in hits); other
ties in the prompt's rendezvous ranking (cache_aware's home first). Under cache_aware's load rules: an
engine shedding the prompt (its stable number below the engine's shed share) or past the hard bound
is skipped, and if every engine sheds it, the hard bound alone decides. Nothing held anywhere, or
no ids for the prompt (a template the gateway cannot render, an engine without events yet): the
ranking alone, as cache_aware. Reasons: the longest match (or, with none, the home) `affinity`; any
other `balance`; no full block `no_match`. The match ratio (held leading blocks / the prompt's
blocks, on the chosen engine) is what `zerogap_route_prefix_match_ratio` shows.

Every process reads the same events and the same load reports, so the decisions agree as far as the
events have arrived everywhere (a few milliseconds apart).
"""

from __future__ import annotations

from collections.abc import Sequence

from common.config.routing import CacheAwareSection
from gateway.pool.routing.kv_index import KvIndex, chain
from gateway.pool.routing.policy import AFFINITY, BALANCE, NO_MATCH, B, Candidate, Route
from gateway.pool.routing.prefix import Prompt
from gateway.pool.routing.rendezvous import Rendezvous
from gateway.pool.routing.tokens import Tokenize, make_tokenize

DEFAULT_BLOCK_SIZE = 16  # until an engine's events say otherwise (vLLM's and the sim's default)


class KvEvents(Rendezvous):
    name = "kv_events"
    listens = True  # the pool's KV-event listener feeds self.index

    def __init__(self, settings: CacheAwareSection, tokenize: Tokenize | None = None) -> None:
        super().__init__(settings)
        self.index = KvIndex()
        self.tokenize = tokenize or make_tokenize(settings.tokenizer)

    def forget(self, name: str) -> None:
        """By URL in the index; the pool forgets by name, and the events of a restarted engine say
        what it holds (vLLM's AllBlocksCleared, or nothing until it stores again)."""

    def blocks(self, prompt: Prompt) -> list[int]:
        """The prompt's chained block keys (empty: no ids for it)."""
        if prompt.body is None:
            return []
        block_size = self.index.block_size() or DEFAULT_BLOCK_SIZE
        most = self.settings.max_prompt_blocks
        ids = self.tokenize(prompt.body, prompt.chat, most * block_size)
        return [] if not ids else chain(ids, block_size, most)

    def route(self, candidates: Sequence[B], prompt: Prompt | None) -> Route[B] | None:
        if not candidates:
            return None
        key = None if prompt is None else prompt.key(self.settings.key_blocks)
        hashes = [] if prompt is None else self.blocks(prompt)
        loads = {c.url: c.load_now() for c in candidates}
        if key is None and not hashes:
            return Route(min(candidates, key=lambda c: loads[c.url]), NO_MATCH)
        if key is None:
            key = hashes[0] & ((1 << 64) - 1)  # a prompt shorter than one text block but a token block long
        matched = {c.url: self.index.match(c.url, hashes) for c in candidates} if hashes else {}
        longest = max(matched.values(), default=0)
        ranking = self.ranking(candidates, key)
        settled = longest >= min(self.settings.key_blocks, len(hashes))  # the prompt's head is held whole
        order = sorted(ranking, key=lambda c: self._place(c, matched.get(c.url, 0), longest, settled, loads))
        hard = self.hard_bound(list(loads.values()))
        first = order[0]
        for keep_shed in (True, False):
            for c in order:
                if loads[c.url] + 1 <= hard and (not keep_shed or self.stays(key, c.url)):
                    best = c is first or (longest > 0 and matched[c.url] == longest)
                    return Route(c, AFFINITY if best else BALANCE, matched.get(c.url, 0), len(hashes))
        chosen = min(order, key=lambda c: loads[c.url])  # unreachable with integer loads
        return Route(chosen, BALANCE, matched.get(chosen.url, 0), len(hashes))

    @staticmethod
    def _place(c: Candidate, matched: int, longest: int, settled: bool, loads: dict[str, int]) -> tuple[int, int]:
        """Longest match first; among the engines that hold the longest match and at least the prompt's
        key blocks, the least loaded (they all hold it: no hit is lost), else the ranking (sorted() keeps it)."""
        return -matched, loads[c.url] if settled and matched == longest else 0
