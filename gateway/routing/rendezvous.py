"""routing = "cache_aware": rendezvous hashing of the prompt's leading blocks, bounded by load.

Every process and pod decides alike, with nothing shared on the request path:

- **Home.** The prompt's key is a stable hash of its first `key_blocks` full blocks
  (prefix.Prompt.key). Each engine's weight for a key is a hash of the key and the engine's URL
  (rendezvous, or highest-random-weight, hashing); the engines in order of weight are the
  prompt's ranking, its home first. Prompts alike in their first blocks share a ranking, so
  they meet in one engine's prefix cache. An engine that leaves moves only the prompts whose
  home it was (to their second engine); one that joins takes only the prompts it now heads:
  about 1/N of them either way.
- **Bounded load** (consistent hashing with bounded loads, Mirrokni et al. 2018): no engine takes
  a request past `hard` = load_factor x the mean load (this request included, rounded up), or the
  mean + `load_slack` requests if more (at low load a few requests more matter less than a prefix
  moved). Below it, from `soft` = hard - (load_factor - 1) x the mean (the mean itself when the
  slack does not count), an engine sheds a share of its prompts that grows from 0 at `soft` to 1
  at `hard`: the same prompts each time (a stable number per prompt and engine decides), so whole
  prefixes move, not some requests of each. A prompt it does not take goes to the next engine of
  its ranking, so a hot prefix spreads over its second and third engines. The hard bound always
  leaves one engine open (the least loaded one).
- **Load** is Backend.load_now(): what the engine reported at the last scrape (running + waiting,
  which every process reads alike) plus this process's requests there since; the policy asks for
  a scrape every `load_scrape_interval_s` (0.1 s), so that every process bounds by a fresh figure.
- **Reasons.** home: `affinity`; a later engine of the ranking: `balance`; a prompt without one
  full block: least load, `no_match`.

Pure: the decision is a function of the key, the candidates' URLs and their loads.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence

from gateway.routing.policy import AFFINITY, BALANCE, NO_MATCH, B, Route, RoutingPolicy
from gateway.routing.prefix import Prompt
from zerogap.config.routing import CacheAwareSection

MASK = (1 << 64) - 1
SHED_SALT = 0x5BD1E9955BD1E995  # the per-prompt number that decides shedding is not its weight


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
        self.scrape_interval_s = settings.load_scrape_interval_s
        self._seeds: dict[str, int] = {}

    def seed(self, url: str) -> int:
        found = self._seeds.get(url)
        if found is None:
            found = self._seeds[url] = engine_seed(url)
        return found

    def ranking(self, candidates: Sequence[B], key: int) -> list[B]:
        """The candidates by their weight for this key, highest (the home) first."""
        return sorted(candidates, key=lambda c: mix64(key ^ self.seed(c.url)), reverse=True)

    def bounds(self, loads: Sequence[int]) -> tuple[int, int]:
        """(soft, hard), this request included: hard is load_factor x the mean load, or the mean +
        load_slack if more; soft is hard less (load_factor - 1) x the mean (the mean itself when the
        slack does not count), so at low load a few requests more shed nothing."""
        s = self.settings
        mean = (sum(loads) + 1) / len(loads)
        hard = max(math.ceil(s.load_factor * mean), math.ceil(mean) + s.load_slack)
        return max(math.ceil(mean), hard - math.ceil((s.load_factor - 1) * mean)), hard

    def route(self, candidates: Sequence[B], prompt: Prompt | None) -> Route[B] | None:
        if not candidates:
            return None
        key = None if prompt is None else prompt.key(self.settings.key_blocks)
        loads = {c.url: c.load_now() for c in candidates}
        if key is None:
            return Route(min(candidates, key=lambda c: loads[c.url]), NO_MATCH)  # the first of the least
        soft, hard = self.bounds(list(loads.values()))
        ranking = self.ranking(candidates, key)
        for i, c in enumerate(ranking):
            after = loads[c.url] + 1
            if after <= soft or (after <= hard and self.stays(key, c.url, (after - soft) / (hard - soft + 1))):
                return Route(c, BALANCE if i else AFFINITY)
        for i, c in enumerate(ranking):  # each one in its band shed this prompt: the hard bound alone
            if loads[c.url] + 1 <= hard:
                return Route(c, BALANCE if i else AFFINITY)
        return Route(min(ranking, key=lambda c: loads[c.url]), BALANCE)  # unreachable with integer loads

    def stays(self, key: int, url: str, shed: float) -> bool:
        """Whether the prompt stays on an engine that sheds this share of its prompts (between its
        soft and hard bound): the same prompts each time (a stable number per prompt and engine),
        so a loaded engine hands whole prefixes to their next engine, not some requests of each."""
        return mix64(key ^ self.seed(url) ^ SHED_SALT) / 2**64 >= shed
