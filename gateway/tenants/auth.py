"""Who is calling: the unified key or a virtual key, served from memory.

The virtual keys are reloaded from the key store whenever its version row changes
(checked every [gateway].key_refresh_interval_s), so a revocation takes effect within
about that long, whichever process made it; expiry is checked on every request against
the wall clock.

If the store cannot be read (its periodic refresh fails), [gateway].on_store_down decides:
"serve_cached" (the default) keeps serving the keys loaded before, "refuse" answers every
virtual key 503 until a refresh succeeds again; the unified key is not in the store and works
either way. Failed authentications count against the client's address (gateway/tenants/auth_throttle.py).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from common.config.gateway import GatewaySection
from gateway.server.errors import ApiError
from gateway.tenants.auth_throttle import AuthThrottle
from gateway.tenants.keys.base import NO_LIMITS, KeyLimits, KeyRecord, Store

if TYPE_CHECKING:
    from gateway.observe.metrics import GatewayMetrics

log = logging.getLogger("zerogap.gateway.auth")

UNIFIED = "unified"
MISS_RELOAD_S = 0.05  # unknown keys re-read the store at most this often
FAILURE_REASONS = ("missing", "malformed", "invalid", "expired")


@dataclass(frozen=True)
class Principal:
    """An authenticated caller. `name` is safe to log and to use as a metric label."""

    name: str
    models: frozenset[str] | None = None
    limits: KeyLimits = NO_LIMITS  # the unified key has none
    expires_at: float | None = None

    def may_use(self, model: str) -> bool:
        return self.models is None or model in self.models


def _principal(record: KeyRecord) -> Principal:
    models = frozenset(record.models) if record.models is not None else None
    return Principal(record.name, models, record.limits, record.expires_at)


class AuthFailure(ApiError):
    """A 401; `reason` (one of FAILURE_REASONS) labels zerogap_auth_failures_total."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(401, message, "authentication_error", code="invalid_api_key")
        self.reason = reason


def unauthorized(message: str, reason: str = "invalid") -> AuthFailure:
    return AuthFailure(message, reason)


def bearer_token(authorization: bytes | None, what: str = "your key") -> bytes:
    """The token of 'Bearer <token>'; AuthFailure (missing or malformed) otherwise."""
    if authorization is None:
        raise unauthorized(f"Missing API key. Send the header 'Authorization: Bearer <{what}>'.", "missing")
    scheme, _, token = authorization.partition(b" ")
    token = token.strip()
    if scheme.lower() != b"bearer" or not token:
        raise unauthorized(f"Malformed Authorization header. Send 'Authorization: Bearer <{what}>'.", "malformed")
    return token


def store_down() -> ApiError:
    return ApiError(
        503,
        "The key store is unreachable and this gateway refuses virtual keys until it is back "
        '([gateway].on_store_down = "refuse"). Retry shortly.',
        "api_error",
        code="key_store_unavailable",
        headers={"Retry-After": "1"},
    )


class Authenticator:
    def __init__(
        self,
        unified_key: str,
        store: Store,
        settings: GatewaySection | None = None,
        metrics: GatewayMetrics | None = None,
    ) -> None:
        settings = settings or GatewaySection()
        self._unified = unified_key.encode()
        self._store = store
        self._by_digest: dict[str, Principal] = {}
        self._version = -1
        self._last_miss_reload_s = 0.0
        self._miss_reload: asyncio.Future[bool] | None = None
        self._reloading = asyncio.Lock()  # one read of the store at a time: a slower one never undoes a newer
        self.refuse_when_down = settings.on_store_down == "refuse"
        self.store_up = True
        self.throttle = AuthThrottle(settings.auth_failures_limit, settings.auth_failure_window_s)
        self._metrics = metrics
        if metrics is not None:
            for reason in FAILURE_REASONS:  # every series exists from the start, at 0
                metrics.auth_failures.labels(reason)
            for action in ("served_cached", "refused"):
                metrics.key_store_down_requests.labels(action)
            metrics.key_store_up.set(1)

    async def reload(self) -> bool:
        """Reload the keys if the store changed. True if reloaded. One at a time (the periodic
        refresh and a miss's): two side by side could end out of order, the one that read the
        store first (without a key just made) replacing what the later one loaded."""
        async with self._reloading:
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
            except Exception as exc:  # the store may be busy or down: on_store_down says what to do
                if self.store_up:
                    self._store_went_down(exc)
            else:
                if not self.store_up:
                    self._store_came_back()

    def _store_went_down(self, exc: Exception) -> None:
        self.store_up = False
        if self._metrics is not None:
            self._metrics.key_store_up.set(0)
        if self.refuse_when_down:
            log.warning('key store unreachable: virtual keys get 503 until it is back ([gateway].on_store_down = '
                        '"refuse"); the unified key still works: %s', exc)  # fmt: skip
        else:
            log.warning('key store unreachable, keeping the %d keys loaded before ([gateway].on_store_down = '
                        '"serve_cached"): %s', len(self._by_digest), exc)  # fmt: skip

    def _store_came_back(self) -> None:
        self.store_up = True
        if self._metrics is not None:
            self._metrics.key_store_up.set(1)
        log.warning("key store reachable again: virtual keys are checked against it again")

    async def authenticate(self, authorization: bytes | None, client: str | None = None) -> Principal:
        """The caller of a request with this Authorization header, from the address `client`.
        401 (counted against the address), 429 while the address is blocked, 503 for a virtual
        key while the store is down and on_store_down = "refuse"."""
        blocked_s = self.throttle.blocked_for_s(client)
        if blocked_s:
            principal = await self._while_blocked(authorization, client, blocked_s)
        else:
            try:
                principal = await self._identify(authorization, may_reload=True)
            except AuthFailure as exc:
                self._failed(client, exc.reason)
                raise
            self.throttle.succeeded(client, principal.name)
        if not self.store_up and principal.name != UNIFIED and self._metrics is not None:
            self._metrics.key_store_down_requests.labels("served_cached").inc()
        return principal

    async def _while_blocked(self, authorization: bytes | None, client: str | None, blocked_s: float) -> Principal:
        """Only a key that authenticated from this address before passes; anything else gets the
        same 429, right or wrong, and is not counted. Keys are looked up in memory only: a blocked
        address makes the gateway read nothing from the store."""
        try:
            principal = await self._identify(authorization, may_reload=False)
        except AuthFailure:
            principal = None
        if principal is None or not self.throttle.known_good(client, principal.name):
            if self._metrics is not None:
                self._metrics.auth_throttled.inc()
            raise self.throttle.refusal(blocked_s)
        return principal

    async def _identify(self, authorization: bytes | None, may_reload: bool) -> Principal:
        token = bearer_token(authorization)
        if self._unified and hmac.compare_digest(token, self._unified):
            return Principal(UNIFIED)
        if not self.store_up and self.refuse_when_down:
            if self._metrics is not None:
                self._metrics.key_store_down_requests.labels("refused").inc()
            raise store_down()
        try:
            digest = self._store.digest(token.decode())
        except UnicodeDecodeError:
            raise unauthorized("Invalid API key.") from None
        principal = self._by_digest.get(digest)
        if principal is None and may_reload:  # looked up again whatever the re-read found: the periodic
            await self._reload_on_miss()  # refresh may have loaded the key while this one read the store
            principal = self._by_digest.get(digest)
        if principal is None:
            raise unauthorized("Invalid API key, or it has been revoked. Ask for a new key.")
        if principal.expires_at is not None and principal.expires_at <= time.time():
            raise unauthorized(f"The API key {principal.name!r} has expired. Ask for a new key.", "expired")
        return principal

    def _failed(self, client: str | None, reason: str) -> None:
        if self._metrics is not None:
            self._metrics.auth_failures.labels(reason).inc()
        self.throttle.failed(client)

    def check_secret(self, authorization: bytes | None, client: str | None, secret: str, setting: str) -> None:
        """A request that must carry one fixed secret (`setting` names it: "[server].metrics_key",
        "[server].admin_key"): 401 and 429 as for API keys, the same count per address."""
        blocked_s = self.throttle.blocked_for_s(client)
        if blocked_s:
            if not (self._matches(authorization, secret) and self.throttle.known_good(client, setting)):
                if self._metrics is not None:
                    self._metrics.auth_throttled.inc()
                raise self.throttle.refusal(blocked_s)
            return
        try:
            token = bearer_token(authorization, setting)
            if not hmac.compare_digest(token, secret.encode()):
                raise unauthorized(f"Invalid key. This endpoint needs 'Authorization: Bearer <{setting}>'.")
        except AuthFailure as exc:
            self._failed(client, exc.reason)
            raise
        self.throttle.succeeded(client, setting)

    def holds_secret(self, authorization: bytes | None, client: str | None, secret: str, setting: str) -> bool:
        """Whether an optional Authorization header carries the secret (GET /ready's detail):
        no header is no failure; a wrong one counts, and a blocked address is told nothing."""
        if authorization is None:
            return False
        try:
            self.check_secret(authorization, client, secret, setting)
        except ApiError:
            return False
        return True

    @staticmethod
    def _matches(authorization: bytes | None, secret: str) -> bool:
        try:
            return hmac.compare_digest(bearer_token(authorization), secret.encode())
        except AuthFailure:
            return False
