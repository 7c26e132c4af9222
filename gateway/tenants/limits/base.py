"""The limiter's interface (Limiter) and the concurrency slot it hands out (Slot)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Protocol

from gateway.tenants.auth import Principal


@dataclass
class Slot:
    """One request's place among its key's max_concurrency. `local`: counted in this process's
    memory (no shared store, or the shared one was down when it was taken)."""

    key: str
    lease_id: str
    local: bool = False
    released: bool = False


_lease_numbers = itertools.count()


def new_slot(key: str, prefix: str, local: bool = False) -> Slot:
    return Slot(key, f"{prefix}:{next(_lease_numbers)}", local)


class Limiter(Protocol):
    async def admit(self, who: Principal) -> Slot | None:
        """At the headers: take one request (rpm) and a concurrency slot (when the key has a
        max_concurrency: returned, to be released), or raise ApiError 429 (or 503, Redis down
        with on_redis_down = "refuse")."""
        ...

    async def reserve(self, who: Principal, estimate: int, budget_tokens: int) -> None:
        """After the body: reserve `estimate` tokens of the key's tpm, or raise ApiError 429/400."""
        ...

    def settle(self, who: Principal, estimate: int, actual: int) -> None:
        """Replace a request's reservation by what it used (may finish in the background)."""
        ...

    def release(self, slot: Slot) -> None:
        """The request of this slot has ended (a second call does nothing)."""
        ...

    async def close(self) -> None: ...


def limited_at_head(who: Principal) -> bool:
    return who.limits.rpm is not None or who.limits.max_concurrency is not None
