"""Who is calling: the unified key or a virtual key, served from memory.

The virtual keys are reloaded from the key store whenever its version row changes
(checked every [gateway].key_refresh_interval_s), so a revocation takes effect within
about that long, whichever process made it; expiry is checked on every request against
the wall clock. If the store cannot be read (a database down), the keys loaded before
keep working and a warning is logged.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from dataclasses import dataclass

from gateway.errors import ApiError
from gateway.store import KeyRecord, Store

log = logging.getLogger("zerogap.gateway.auth")

UNIFIED = "unified"
MISS_RELOAD_S = 0.05  # unknown keys re-read the store at most this often


@dataclass(frozen=True)
class Principal:
    """An authenticated caller. `name` is safe to log and to use as a metric label."""

    name: str
    models: frozenset[str] | None = None
    rpm: int | None = None
    tpm: int | None = None
    expires_at: float | None = None
    max_concurrency: int | None = None  # requests of this key in flight at once (None: no cap)

    def may_use(self, model: str) -> bool:
        return self.models is None or model in self.models


def _principal(record: KeyRecord) -> Principal:
    models = frozenset(record.models) if record.models is not None else None
    return Principal(record.name, models, record.rpm, record.tpm, record.expires_at, record.max_concurrency)


def unauthorized(message: str) -> ApiError:
    return ApiError(401, message, "authentication_error", code="invalid_api_key")


class Authenticator:
    def __init__(self, unified_key: str, store: Store) -> None:
        self._unified = unified_key.encode()
        self._store = store
        self._by_digest: dict[str, Principal] = {}
        self._version = -1
        self._last_miss_reload_s = 0.0
        self._failing = False
        self._miss_reload: asyncio.Future[bool] | None = None

    async def reload(self) -> bool:
        """Reload the keys if the store changed. True if reloaded."""
        version = await self._store.version()
        if version == self._version:
            return False
        records = await self._store.keys()
        self._by_digest = {r.digest: _principal(r) for r in records if r.revoked_at is None}
        self._version = version
        log.debug("loaded %d active virtual keys (store version %d)", len(self._by_digest), version)
        return True

    async def _reload_on_miss(self) -> bool:
        """A key created a moment ago works at once: an unknown key re-reads the store's
        change counter, and the keys only when they changed. At most one read every
        MISS_RELOAD_S: requests that miss meanwhile wait for the next one and share it."""
        if self._miss_reload is None or self._miss_reload.done():
            delay_s = self._last_miss_reload_s + MISS_RELOAD_S - time.monotonic()
            self._miss_reload = asyncio.ensure_future(self._reload_after(delay_s))
        return await asyncio.shield(self._miss_reload)

    async def _reload_after(self, delay_s: float) -> bool:
        if delay_s > 0:
            await asyncio.sleep(delay_s)
        self._last_miss_reload_s = time.monotonic()
        try:
            return await self.reload()
        except Exception as exc:  # the periodic refresh will try again
            log.debug("key store re-read for an unknown key failed: %s", exc)
            return False

    async def refresh_forever(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self.reload()
            except Exception as exc:  # the store may be busy or down: keep the last keys
                if not self._failing:
                    log.warning(
                        "key store unreachable, keeping the %d keys loaded before: %s", len(self._by_digest), exc
                    )
                self._failing = True
            else:
                if self._failing:
                    log.warning("key store reachable again")
                self._failing = False

    async def authenticate(self, authorization: bytes | None, client: str | None = None) -> Principal:
        """The caller of a request with this Authorization header, from the address `client`."""
        if authorization is None:
            raise unauthorized("Missing API key. Send the header 'Authorization: Bearer <your key>'.")
        scheme, _, token = authorization.partition(b" ")
        token = token.strip()
        if scheme.lower() != b"bearer" or not token:
            raise unauthorized("Malformed Authorization header. Send 'Authorization: Bearer <your key>'.")
        if self._unified and hmac.compare_digest(token, self._unified):
            return Principal(UNIFIED)
        try:
            digest = self._store.digest(token.decode())
        except UnicodeDecodeError:
            raise unauthorized("Invalid API key.") from None
        principal = self._by_digest.get(digest)
        if principal is None and await self._reload_on_miss():
            principal = self._by_digest.get(digest)
        if principal is None:
            raise unauthorized("Invalid API key, or it has been revoked. Ask for a new key.")
        if principal.expires_at is not None and principal.expires_at <= time.time():
            raise unauthorized(f"The API key {principal.name!r} has expired. Ask for a new key.")
        return principal
