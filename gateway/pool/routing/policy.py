"""The routing interface: a policy gets the candidates (healthy backends not yet tried, in the
pool's rotation order: the first wins a tie) and the request's prompt, and names one.

A policy is an object with `route`; the pool builds the candidates (health, panic routing,
retries, rotation) and calls it, the relay reports the route's reason to the metrics. Policies
that read the prompt set `reads_prompt` (the relay serializes it only for them). Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from gateway.pool.routing.prefix import Prompt

AFFINITY, BALANCE, NO_MATCH = "affinity", "balance", "no_match"
REASONS = (AFFINITY, BALANCE, NO_MATCH)  # zerogap_route_decisions_total{reason}
UNTRACKED = ""  # a policy that does not route by prefix: no decision metric


class Candidate(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def url(self) -> str: ...

    def load(self) -> int: ...

    def load_now(self) -> int: ...


B = TypeVar("B", bound=Candidate)


@dataclass(frozen=True, slots=True)
class Route(Generic[B]):
    backend: B
    reason: str  # affinity | balance | no_match, or UNTRACKED
    num_matched: int = 0  # leading blocks the policy knows the chosen backend holds
    num_blocks: int = 0  # blocks it looked at (0: it knows nothing of the cache; no match ratio)


class RoutingPolicy:
    """One model pool's policy. Subclasses override `route`; the rest is optional."""

    name = ""
    reads_prompt = False  # the relay passes the prompt (else None)
    by_prefix = False  # its decisions count in zerogap_route_decisions_total
    keeps_tables = False  # it exports table_sizes() (zerogap_route_prefix_table_blocks, _bytes)
    scrape_interval_s = float("inf")  # the backends' load is scraped at least this often

    def route(self, candidates: Sequence[B], prompt: Prompt | None) -> Route[B] | None:
        raise NotImplementedError

    def observe(self, reported: Mapping[str, int], now_s: float) -> None:
        """A scrape of the pool's healthy backends ended: backend URL -> running + waiting reported."""

    def forget(self, name: str) -> None:
        """The backend is down or ejected: whatever is known of its cache is gone."""

    def table_sizes(self) -> dict[str, tuple[int, int]]:
        """Per backend: (block hashes, bytes) the policy remembers; {} if none."""
        return {}


class LeastLoad(RoutingPolicy):
    """The least requests in flight here + running and waiting there (ties: rotation order)."""

    name = "least_load"

    def route(self, candidates: Sequence[B], prompt: Prompt | None) -> Route[B] | None:
        best = least_loaded(candidates)
        return None if best is None else Route(best, UNTRACKED)


class RoundRobin(RoutingPolicy):
    """The pool's rotation: the first candidate."""

    name = "round_robin"

    def route(self, candidates: Sequence[B], prompt: Prompt | None) -> Route[B] | None:
        return Route(candidates[0], UNTRACKED) if candidates else None


def least_loaded(candidates: Sequence[B]) -> B | None:
    """The first candidate of the least load."""
    best: B | None = None
    best_load = 0
    for c in candidates:
        load = c.load()
        if best is None or load < best_load:
            best, best_load = c, load
    return best
