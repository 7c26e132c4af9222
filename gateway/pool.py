"""The backends of each model and the choice of one for a request."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gateway.routing.affinity import PrefixAffinity, Route
from zerogap.config.gateway import BackendEntry
from zerogap.config.routing import CacheAwareSection


@dataclass(eq=False)
class Backend:
    """One backend and what the gateway knows of it now."""

    name: str
    url: str
    model: str
    upstream_model: str | None = None
    api_key: str | None = None
    healthy: bool = True
    num_inflight: int = 0
    num_reported: int = 0  # running + waiting, scraped from its /metrics
    num_attempts: int = 0  # attempts that ended here (Flights.close): the outlier rates' requests

    @classmethod
    def of(cls, entry: BackendEntry) -> Backend:
        return cls(entry.name, entry.url, entry.model, entry.upstream_model, entry.api_key)

    def load(self) -> int:
        return self.num_inflight + self.num_reported


class ModelPool:
    """The backends serving one model name.

    Panic routing (`panic`, as Envoy's healthy-panic threshold at its lowest): while no backend
    of the model is healthy, every backend is a candidate. A health check that failed because a
    backend answered late (a loaded host, a pause) then costs nothing, and one that is truly down
    refuses the connection and the request fails as it would have."""

    def __init__(
        self,
        model: str,
        backends: list[Backend],
        policy: str,
        cache_aware: CacheAwareSection | None = None,
        panic: bool = True,
    ) -> None:
        self.model = model
        self.backends = backends
        self.policy = policy
        self.panic = panic
        self._next = 0
        self.affinity = PrefixAffinity(cache_aware or CacheAwareSection()) if policy == "cache_aware" else None

    def panicking(self) -> bool:
        """Whether requests go to backends out of the pool now (panic routing, none healthy)."""
        return self.panic and not any(b.healthy for b in self.backends)

    def choose(self, exclude: Iterable[Backend] = ()) -> Backend | None:
        """The healthy backend to use (any, when panicking), or None. Least load (ties rotate) or round-robin."""
        skip = set(exclude)
        n = len(self.backends)
        start = self._next
        if not skip:  # a retry does not move the rotation
            self._next = (start + 1) % n
        panic = self.panicking()
        best: Backend | None = None
        for i in range(n):
            b = self.backends[(start + i) % n]
            if not (b.healthy or panic) or b in skip:
                continue
            if self.policy == "round_robin":
                return b
            if best is None or b.load() < best.load():
                best = b
        return best

    def route(self, exclude: Iterable[Backend], hashes: Sequence[int]) -> Route[Backend] | None:
        """cache_aware: the healthy backends not yet tried, in the rotation's order, to the
        prefix tables; a backend that is down loses its table (its engine's cache is gone)."""
        assert self.affinity is not None
        skip = set(exclude)
        n = len(self.backends)
        start = self._next
        if not skip:
            self._next = (start + 1) % n
        panic = self.panicking()
        candidates = []
        for i in range(n):
            b = self.backends[(start + i) % n]
            if not b.healthy:
                self.affinity.forget(b.name)
            if (b.healthy or panic) and b not in skip:
                candidates.append(b)
        return self.affinity.route(candidates, hashes)

    def any_healthy(self, besides: Backend | None = None) -> bool:
        """Whether a backend of this model other than `besides` is in the pool."""
        return any(b.healthy for b in self.backends if b is not besides)


class Router:
    """All pools, by the model name clients ask for."""

    def __init__(
        self,
        entries: Iterable[BackendEntry],
        policy: str,
        cache_aware: CacheAwareSection | None = None,
        panic: bool = True,
    ) -> None:
        self.backends = [Backend.of(e) for e in entries]
        by_model: dict[str, list[Backend]] = {}
        for b in self.backends:
            by_model.setdefault(b.model, []).append(b)
        self.pools = {m: ModelPool(m, bs, policy, cache_aware, panic) for m, bs in by_model.items()}

    def ready(self) -> bool:
        return any(b.healthy for b in self.backends)
