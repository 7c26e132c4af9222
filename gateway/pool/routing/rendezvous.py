"""routing = "cache_aware": rendezvous hashing of the prompt's leading blocks, bounded by load.

Every process and pod decides alike, with nothing shared on the request path:

- **Home.** The prompt's key is a stable hash of its first `key_blocks` full blocks
  (prefix.Prompt.key). Each engine's weight for a key is a hash of the key and the engine's URL
  (rendezvous, or highest-random-weight, hashing); the engines in order of weight are the
  prompt's ranking, its home first. Prompts alike in their first blocks share a ranking, so
  they meet in one engine's prefix cache. An engine that leaves moves only the prompts whose
  home it was (to their second engine); one that joins takes only the prompts it now heads:
  about 1/N of them either way.
- **Shedding** (what keeps the engines even): after each scrape of the engines' load, every
  process moves each engine's shed share toward what the reports call for: up while the engine
  reports more than the mean + a tolerance, down while less, `shed_rate` (0.5) per second per
  unit of relative excess, between 0 and 0.95. The tolerance is 2 % of the mean, or at low load
  load_slack x min(1, load_slack / mean) requests (4 at a mean of 4, 1 at a mean of 16). A prompt
  skips an engine whose shed share is above the prompt's stable number for that engine (a hash of
  key and URL, uniform in [0, 1)), so a loaded engine hands whole prefixes, the same ones in every
  process, to their next engine, and takes them back as its load falls. Every process reads the
  same reports, so the shares, and the decisions, agree.
- **Hard bound** (consistent hashing with bounded loads): no engine takes a request past
  `load_factor` (1.15) x the mean load (this request included, rounded up), or the mean +
  `load_slack` (4) requests if that is more; the prompt goes to the next engine of its ranking.
  It catches what shedding is too slow for (a burst, one prefix hotter than an engine). The load
  here is Backend.load_now(): what the engine reported at the last scrape plus this process's
  requests there since; the policy asks for a scrape every `load_scrape_interval_s` (0.1 s).
- **Reasons.** home: `affinity`; a later engine of the ranking: `balance`; a prompt without one
  full block: least load, `no_match`.

Pure: the decision is a function of the key, the candidates' URLs, their loads and the shed
shares, which are a function of the reports observed.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence

from common.config.routing import CacheAwareSection
from gateway.pool.routing.policy import AFFINITY, BALANCE, NO_MATCH, B, Route, RoutingPolicy
from gateway.pool.routing.prefix import Prompt

MASK = (1 << 64) - 1
SHED_SALT = 0x5BD1E9955BD1E995  # the per-prompt number that decides shedding is not its weight
SHED_MARGIN = 0.02  # an engine sheds while it reports more than the mean + 2 % (or the slack at low load)
MAX_SHED = 0.95  # every engine keeps some of its prompts (the hard bound spreads the rest)
MAX_STEP_S = 1.0  # a late scrape moves the shares at most this much time's worth


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
        self.shed: dict[str, float] = {}  # engine URL -> the share of its prompts it hands on
        self._seeds: dict[str, int] = {}
        self._observed_s: float | None = None

    def seed(self, url: str) -> int:
        found = self._seeds.get(url)
        if found is None:
            found = self._seeds[url] = engine_seed(url)
        return found

    def ranking(self, candidates: Sequence[B], key: int) -> list[B]:
        """The candidates by their weight for this key, highest (the home) first."""
        return sorted(candidates, key=lambda c: mix64(key ^ self.seed(c.url)), reverse=True)

    def hard_bound(self, loads: Sequence[int]) -> int:
        """The most load an engine may carry with this request: load_factor x the mean load, or
        the mean + load_slack if more (this request included, rounded up). A slack that fades with
        the load (as the shedding's tolerance does) spread a hot prefix better but cost the hit rate
        across processes (gateway/README.md, "Measured"): not kept."""
        s = self.settings
        mean = (sum(loads) + 1) / len(loads)
        return max(math.ceil(s.load_factor * mean), math.ceil(mean) + s.load_slack)

    def observe(self, reported: Mapping[str, int], now_s: float) -> None:
        """One scrape's reports (engine URL -> running + waiting) of the pool's healthy engines:
        each engine's shed share moves toward what its excess over the mean calls for."""
        dt_s = 0.0 if self._observed_s is None else min(MAX_STEP_S, max(0.0, now_s - self._observed_s))
        self._observed_s = now_s
        if not reported or dt_s == 0.0:
            return
        mean = sum(reported.values()) / len(reported)
        scale = max(mean, 1.0)
        slack = self.settings.load_slack
        tolerated = max(SHED_MARGIN * mean, slack * min(1.0, slack / scale))  # at low load, a few more are fine
        step = self.settings.shed_rate * dt_s
        for url, load in reported.items():
            excess = (load - mean - tolerated) / scale
            self.shed[url] = min(MAX_SHED, max(0.0, self.shed.get(url, 0.0) + step * excess))

    def route(self, candidates: Sequence[B], prompt: Prompt | None) -> Route[B] | None:
        if not candidates:
            return None
        key = None if prompt is None else prompt.key(self.settings.key_blocks)
        loads = {c.url: c.load_now() for c in candidates}
        if key is None:
            return Route(min(candidates, key=lambda c: loads[c.url]), NO_MATCH)  # the first of the least
        hard = self.hard_bound(list(loads.values()))
        ranking = self.ranking(candidates, key)
        for i, c in enumerate(ranking):
            if loads[c.url] + 1 <= hard and self.stays(key, c.url):
                return Route(c, BALANCE if i else AFFINITY)
        for i, c in enumerate(ranking):  # every engine sheds this prompt: the hard bound alone
            if loads[c.url] + 1 <= hard:
                return Route(c, BALANCE if i else AFFINITY)
        return Route(min(ranking, key=lambda c: loads[c.url]), BALANCE)  # unreachable with integer loads

    def stays(self, key: int, url: str) -> bool:
        """Whether the engine keeps this prompt: its stable number there is not below the shed share."""
        return mix64(key ^ self.seed(url) ^ SHED_SALT) / 2**64 >= self.shed.get(url, 0.0)
