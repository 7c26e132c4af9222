"""routing = "cache_aware": rendezvous hashing of the prompt's leading blocks, bounded by load.

Every process and pod decides alike, with nothing shared on the request path:

- **Home.** The prompt's key is a stable hash of its first `key_blocks` full blocks
  (prefix.Prompt.key). Each engine's weight for a key is a hash of the key and the engine's URL
  (rendezvous, or highest-random-weight, hashing); the engines in order of weight are the
  prompt's ranking, its home first. Prompts alike in their first blocks share a ranking, so
  they meet in one engine's prefix cache. An engine that leaves moves only the prompts whose
  home it was (to their second engine); one that joins takes only the prompts it now heads:
  about 1/N of them either way.
- **Bounded load** (consistent hashing with bounded loads, Mirrokni et al. 2018): an engine
  takes the request while its load + 1 is at most ceil(load_factor x (total load + 1) / N); past
  it the request goes to the next engine of its ranking. Load is what least_load reads (requests
  this process has in flight there + running + waiting that the engine reports, which every
  process scrapes), so a hot prefix spreads over its second and third engines and no engine runs
  far ahead of the mean. The bound always leaves one engine open (the least loaded one).
- **Reasons.** home: `affinity`; a later engine of the ranking: `balance`; a prompt without one
  full block: least load, `no_match`.

Pure: the decision is a function of the key, the candidates' URLs and their loads.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence

from gateway.routing.policy import AFFINITY, BALANCE, NO_MATCH, B, Route, RoutingPolicy, least_loaded
from gateway.routing.prefix import Prompt
from zerogap.config.routing import CacheAwareSection

MASK = (1 << 64) - 1


def mix64(x: int) -> int:
    """SplitMix64's finalizer: a 64-bit integer to a well-spread one."""
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


def engine_seed(url: str) -> int:
    return int.from_bytes(hashlib.blake2b(url.encode(), digest_size=8).digest(), "big")


class Rendezvous(RoutingPolicy):
    name = "cache_aware"
    reads_prompt = True
    by_prefix = True

    def __init__(self, settings: CacheAwareSection) -> None:
        self.settings = settings
        self._seeds: dict[str, int] = {}

    def seed(self, url: str) -> int:
        found = self._seeds.get(url)
        if found is None:
            found = self._seeds[url] = engine_seed(url)
        return found

    def ranking(self, candidates: Sequence[B], key: int) -> list[B]:
        """The candidates by their weight for this key, highest (the home) first."""
        return sorted(candidates, key=lambda c: mix64(key ^ self.seed(c.url)), reverse=True)

    def capacity(self, candidates: Sequence[B]) -> int:
        """The most load (this request included) one engine may carry now."""
        total = sum(c.load() for c in candidates)
        return math.ceil(self.settings.load_factor * (total + 1) / len(candidates))

    def route(self, candidates: Sequence[B], prompt: Prompt | None) -> Route[B] | None:
        if not candidates:
            return None
        key = None if prompt is None else prompt.key(self.settings.key_blocks)
        if key is None:
            least = least_loaded(candidates)
            assert least is not None
            return Route(least, NO_MATCH)
        cap = self.capacity(candidates)
        ranking = self.ranking(candidates, key)
        for i, c in enumerate(ranking):
            if c.load() + 1 <= cap:
                return Route(c, BALANCE if i else AFFINITY)
        least = least_loaded(ranking)  # loads that are not integers; never with int loads
        assert least is not None
        return Route(least, BALANCE)
