"""The key store's interface: virtual keys and usage, kept as a keyed hash of each secret.

Two implementations: the embedded SQLite file (gateway/tenants/keys/sqlite.py, the default) and
PostgreSQL (gateway/tenants/keys/postgres.py, with [gateway].database_url), which every gateway process
and pod on one database shares. Both keep a change counter (`version`) that every change to
the keys bumps, so a gateway notices a new, revoked or changed key by reading one row.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

KEY_PREFIX = "zg-"
RESERVED_NAMES = frozenset({"unified"})


class KeyStoreError(Exception):
    """A key-store problem the user can fix; str() says what to do."""


class DuplicateKeyName(KeyStoreError):
    """A key of that name exists already."""


@dataclass(frozen=True)
class KeyRecord:
    """A stored key. models: None allows every model; a tuple allows exactly those names."""

    name: str
    digest: str
    models: tuple[str, ...] | None
    rpm: int | None
    tpm: int | None
    created_at: float
    expires_at: float | None
    revoked_at: float | None
    max_concurrency: int | None = None

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
        rpm: int | None = None,
        tpm: int | None = None,
        expires_at: float | None = None,
        max_concurrency: int | None = None,
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
