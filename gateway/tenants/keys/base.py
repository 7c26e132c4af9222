"""The key store's interface: virtual keys and usage, kept as a keyed hash of each secret.

Two implementations: the embedded SQLite file (gateway/tenants/keys/sqlite.py, the default) and
PostgreSQL (gateway/tenants/keys/postgres.py, with [gateway].database_url), which every gateway process
and pod on one database shares. Both keep a change counter (`version`) that every change to
the keys bumps, so a gateway notices a new, revoked or changed key by reading one row.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from typing import Any, Protocol

KEY_PREFIX = "zg-"
RESERVED_NAMES = frozenset({"unified"})


class KeyStoreError(Exception):
    """A key-store problem the user can fix; str() says what to do."""


class DuplicateKeyName(KeyStoreError):
    """A key of that name exists already."""


def limit(maximum: int, meaning: str) -> Any:
    """A field of KeyLimits: None (no limit) or a whole number from 1 to `maximum`."""
    return field(default=None, metadata={"maximum": maximum, "meaning": meaning})


@dataclass(frozen=True)
class KeyLimits:
    """A key's limits, one value carried whole from the store to admission, the admin API and
    `zerogap keys`. Each field is a store column (added to an older table when the store opens), a
    field of the admin API's JSON and a `zerogap keys create --NAME` flag, all made from the list
    here; fields.py checks each against its bound. A new limit: its field here, and the rule that
    applies it (gateway/tenants/limits/rule.py, and the keepers of its counts if it counts).

    Bounds: rpm and tpm size float token buckets, in memory and in Redis (Lua doubles), so they stay
    far below 2**53 for exact refills; max_concurrency: no pool serves more requests at once."""

    rpm: int | None = limit(10**9, "requests per minute")
    tpm: int | None = limit(10**12, "prompt + completion tokens per minute")
    max_concurrency: int | None = limit(100_000, "requests of the key in flight at once")

    @staticmethod
    def names() -> tuple[str, ...]:
        return tuple(f.name for f in fields(KeyLimits))

    @staticmethod
    def maximum(name: str) -> int:
        return int(next(f for f in fields(KeyLimits) if f.name == name).metadata["maximum"])

    @staticmethod
    def meaning(name: str) -> str:
        return str(next(f for f in fields(KeyLimits) if f.name == name).metadata["meaning"])

    def values(self) -> tuple[int | None, ...]:
        return tuple(getattr(self, name) for name in self.names())

    def as_dict(self) -> dict[str, int | None]:
        return dict(zip(self.names(), self.values(), strict=True))


NO_LIMITS = KeyLimits()


@dataclass(frozen=True)
class KeyRecord:
    """A stored key. models: None allows every model; a tuple allows exactly those names."""

    name: str
    digest: str
    models: tuple[str, ...] | None
    limits: KeyLimits
    created_at: float
    expires_at: float | None
    revoked_at: float | None

    def status(self, now: float) -> str:
        if self.revoked_at is not None:
            return "revoked"
        if self.expires_at is not None and self.expires_at <= now:
            return "expired"
        return "active"


@dataclass(frozen=True)
class UsageRow:
    key_name: str
    model: str
    num_requests: int
    prompt_tokens: int
    completion_tokens: int


def new_key(name: str) -> str:
    """A fresh secret for the key `name` (checked against the reserved names)."""
    if name in RESERVED_NAMES:
        raise KeyStoreError(f"the name {name!r} is reserved (it labels the unified key). Choose another.")
    return KEY_PREFIX + secrets.token_urlsafe(32)


def duplicate(name: str) -> DuplicateKeyName:
    return DuplicateKeyName(f"a key named {name!r} exists already. Choose another name.")


class Store(Protocol):
    """What the gateway, the admin API and `zerogap keys` need from a key store."""

    def digest(self, key: str) -> str:
        """The keyed hash under which a secret is stored (no I/O)."""
        ...

    async def open(self) -> None:
        """Connect, create or upgrade the tables; KeyStoreError with what to do when it cannot."""
        ...

    async def version(self) -> int: ...

    async def keys(self) -> list[KeyRecord]: ...

    async def create(
        self,
        name: str,
        models: Iterable[str] | None = None,
        limits: KeyLimits = NO_LIMITS,
        expires_at: float | None = None,
    ) -> str:
        """Store a new key and return its secret (shown once, never stored). The fields are checked
        (gateway/tenants/keys/fields.py: InvalidKeyField names the bad one); models None allows every model."""
        ...

    async def revoke(self, name: str) -> bool:
        """True if an active key of that name was revoked."""
        ...

    async def add_usage(self, rows: Iterable[UsageRow]) -> None:
        """Add (never overwrite) these counts, atomically."""
        ...

    async def usage(self) -> list[UsageRow]: ...

    async def close(self) -> None: ...
