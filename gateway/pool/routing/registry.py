"""[gateway].routing's names and the policy each one builds (one per model pool).

A new policy: its module under gateway/pool/routing/ (a RoutingPolicy subclass), a line here, and
its name in common.config.routing.RoutingName (with its settings there, if any)."""

from __future__ import annotations

from collections.abc import Callable
from typing import get_args

from common.config.routing import CacheAwareSection, RoutingName
from gateway.pool.routing.affinity import PrefixAffinity
from gateway.pool.routing.kv_events import KvEvents
from gateway.pool.routing.policy import LeastLoad, RoundRobin, RoutingPolicy
from gateway.pool.routing.rendezvous import Rendezvous

POLICIES: dict[str, Callable[[CacheAwareSection], RoutingPolicy]] = {
    "least_load": lambda _: LeastLoad(),
    "round_robin": lambda _: RoundRobin(),
    "cache_aware": Rendezvous,
    "cache_aware_local": PrefixAffinity,
    "kv_events": KvEvents,
}
assert set(POLICIES) == set(get_args(RoutingName)), "a routing name without a policy, or one not in the config"


def make_policy(name: str, settings: CacheAwareSection | None = None) -> RoutingPolicy:
    try:
        factory = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown routing policy {name!r}; one of {', '.join(POLICIES)}") from None
    return factory(settings or CacheAwareSection())
