"""The backends of each model and the choice of one for a request."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from common.config.gateway import BackendEntry
from common.config.routing import CacheAwareSection
from gateway.pool.routing.policy import Route, RoutingPolicy
from gateway.pool.routing.prefix import Prompt
from gateway.pool.routing.registry import make_policy


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
    num_inflight_at_scrape: int = 0  # num_inflight when num_reported was read
    num_attempts: int = 0  # attempts that ended here (Flights.close): the outlier rates' requests
    kv_events_endpoint: str | None = None  # its KV-event publisher (routing = "kv_events")
    kv_events_replay_endpoint: str | None = None
    kv_events_topic: str = ""

    @classmethod
    def of(cls, entry: BackendEntry) -> Backend:
        return cls(
            entry.name, entry.url, entry.model, entry.upstream_model, entry.api_key,
            kv_events_endpoint=entry.kv_events_endpoint, kv_events_replay_endpoint=entry.kv_events_replay_endpoint,
            kv_events_topic=entry.kv_events_topic,
        )  # fmt: skip

    def load(self) -> int:
        return self.num_inflight + self.num_reported

    def load_now(self) -> int:
        """Its requests now, as well as this process knows: what it reported at the last scrape plus
        this process's requests there since (started less ended); at least this process's own. One
        unit per request in every process (load() counts this process's requests twice), so with
        several processes each one's figure is close to the others'."""
        return max(self.num_inflight, self.num_reported + self.num_inflight - self.num_inflight_at_scrape)


class ModelPool:
    """The backends serving one model name, and its routing policy (gateway/pool/routing/).

    The pool makes the candidates: the healthy backends not yet tried, in the rotation's order
    (ties rotate); a backend that is down makes the policy forget it (its engine's cache is gone).
    Panic routing (`panic`, as Envoy's healthy-panic threshold at its lowest): while no backend
    of the model is healthy, every backend is a candidate. A health check that failed because a
    backend answered late (a loaded host, a pause) then costs nothing, and one that is truly down
    refuses the connection and the request fails as it would have."""

    def __init__(
        self,
        model: str,
        backends: list[Backend],
        policy: str | RoutingPolicy,
        cache_aware: CacheAwareSection | None = None,
        panic: bool = True,
    ) -> None:
        self.model = model
        self.backends = backends
        self.policy = make_policy(policy, cache_aware) if isinstance(policy, str) else policy
        self.panic = panic
        self._next = 0

    def panicking(self) -> bool:
        """Whether requests go to backends out of the pool now (panic routing, none healthy)."""
        return self.panic and not any(b.healthy for b in self.backends)

    def candidates(self, exclude: Iterable[Backend] = ()) -> list[Backend]:
        """The backends a request may go to now, in the rotation's order (a retry does not move it)."""
        skip = set(exclude)
        n = len(self.backends)
        start = self._next
        if not skip:
            self._next = (start + 1) % n
        panic = self.panicking()
        found = []
        for i in range(n):
            b = self.backends[(start + i) % n]
            if not b.healthy:
                self.policy.forget(b.name)
            if (b.healthy or panic) and b not in skip:
                found.append(b)
        return found

    def route(self, exclude: Iterable[Backend] = (), prompt: Prompt | None = None) -> Route[Backend] | None:
        """The policy's choice among the candidates, or None when there is none."""
        return self.policy.route(self.candidates(exclude), prompt)

    def choose(self, exclude: Iterable[Backend] = ()) -> Backend | None:
        """A backend for a request whose prompt does not matter (a prefix policy: the least load)."""
        route = self.route(exclude)
        return None if route is None else route.backend

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

    def observe_loads(self, now_s: float) -> None:
        """A scrape of every backend ended: each pool's policy sees what its healthy backends reported."""
        for pool in self.pools.values():
            pool.policy.observe({b.url: b.num_reported for b in pool.backends if b.healthy}, now_s)

    def scrape_interval_s(self, configured_s: float) -> float:
        """How often to scrape the backends' load: the configured interval, or less if a policy asks."""
        return min([configured_s, *(p.policy.scrape_interval_s for p in self.pools.values())])
