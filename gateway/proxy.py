"""The ASGI endpoints of the completion APIs: check the request, then hand it to the relay."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable
from typing import TYPE_CHECKING, TypeVar

from gateway.asgi import (
    ClientGone,
    Receive,
    Scope,
    Send,
    check_declared_length,
    client_host,
    header,
    read_body,
    send_error,
)
from gateway.client_side import ClientSide
from gateway.errors import ApiError, model_not_allowed, unknown_model
from gateway.exchange import Exchange
from gateway.limits import Slot, estimate_tokens, limited_at_head
from gateway.pipe import Pipe
from gateway.request import parse_call

if TYPE_CHECKING:
    from gateway.auth import Principal
    from gateway.gateway import Gateway
    from gateway.pool import ModelPool
    from gateway.relay import Items

log = logging.getLogger("zerogap.gateway.proxy")
T = TypeVar("T")


def method_not_allowed(allowed: str) -> ApiError:
    return ApiError(
        405, f"Method not allowed here; use {allowed}.", code="method_not_allowed", headers={"Allow": allowed}
    )


def check_content_type(scope: Scope) -> None:
    value = header(scope, b"content-type")
    if value is None or value.split(b";")[0].strip().lower() != b"application/json":
        shown = value.decode(errors="replace") if value else "none"
        raise ApiError(415, f"Content-Type must be application/json (got {shown}).", code="unsupported_media_type")


def _unbounded_body(scope: Scope, max_bytes: int) -> bool:
    """The request's body, unread, has no length (chunked) or one above max_bytes: after a refusal
    the server would drain it to the end to keep the connection; better to close it."""
    declared = header(scope, b"content-length")
    if declared is None:
        return header(scope, b"transfer-encoding") is not None
    return not declared.isdigit() or int(declared) > max_bytes


class Admission:
    """What one request's admission holds: released in Completions.__call__'s finally, whatever
    way the request ends."""

    __slots__ = ("body_read", "slot")

    def __init__(self) -> None:
        self.slot: Slot | None = None
        self.body_read = False


class Completions:
    """POST /v1/chat/completions (chat=True) or /v1/completions."""

    def __init__(self, chat: bool) -> None:
        self.chat = chat
        self.path = "/v1/chat/completions" if chat else "/v1/completions"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        arrived_s = time.monotonic()  # TTFT and duration count from here, admission included
        gw: Gateway = scope["app"].state.gateway
        labels = {"model": "none", "key": "none"}  # what is known when a request is refused
        admission = Admission()
        try:
            try:
                exchange, pool = await self._admit(gw, scope, receive, labels, admission)
            except ApiError as exc:
                gw.metrics.requests.labels(labels["model"], "none", labels["key"], str(exc.status)).inc()
                log.debug(
                    "refused %s model=%s key=%s: %s %s", self.path, labels["model"], labels["key"], exc.status, exc
                )
                if not admission.body_read and _unbounded_body(scope, gw.config.gateway.max_body_bytes):
                    exc.headers = {**exc.headers, "Connection": "close"}
                await send_error(send, exc)
                return
            except ClientGone:
                return
            exchange.t0_s = arrived_s
            await serve(gw, exchange, pool, receive, send)
        finally:
            if admission.slot is not None:  # the request has really ended: its slot is free
                gw.limiter.release(admission.slot)

    async def _admit(
        self, gw: Gateway, scope: Scope, receive: Receive, labels: dict[str, str], admission: Admission
    ) -> tuple[Exchange, ModelPool]:
        """The key, its expiry, rpm and concurrency from the headers, before the body is read
        (a refused request is answered without reading it); then the body, the model, and tpm."""
        if scope["method"] != "POST":
            raise method_not_allowed("POST")
        who = await gw.auth.authenticate(header(scope, b"authorization"), client_host(scope))
        labels["key"] = who.name
        check_content_type(scope)
        max_body_bytes = gw.config.gateway.max_body_bytes
        check_declared_length(scope, max_body_bytes)  # 413 before the limits: a refusal takes nothing
        if limited_at_head(who):
            admission.slot = await self._limit(gw, who, "none", gw.limiter.admit(who))
        raw = await read_body(receive, scope, max_body_bytes)
        admission.body_read = True
        call = parse_call(raw, self.path, self.chat, gw.config.gateway)
        pool = gw.router.pools.get(call.model)
        labels["model"] = call.model if pool is not None else "unknown"  # never a client's arbitrary string
        if pool is None:
            raise unknown_model(call.model)
        if not who.may_use(call.model):
            raise model_not_allowed(call.model)
        estimate = estimate_tokens(len(raw), call.budget_tokens)
        if who.tpm is not None:
            await self._limit(gw, who, call.model, gw.limiter.reserve(who, estimate, call.budget_tokens))
        return Exchange(who, call, estimate), pool

    @staticmethod
    async def _limit(gw: Gateway, who: Principal, model: str, check: Awaitable[T]) -> T:
        """The limiter's answer; a refusal is counted in zerogap_ratelimited_total{limit}."""
        try:
            return await check
        except ApiError as exc:
            if exc.status == 429:
                gw.metrics.ratelimited.labels(model, who.name, LIMIT_OF_CODE.get(exc.code or "", "other")).inc()
            raise


LIMIT_OF_CODE = {"rate_limit_requests": "rpm", "rate_limit_tokens": "tpm", "concurrency_limit": "concurrency"}


async def serve(gw: Gateway, exchange: Exchange, pool: ModelPool, receive: Receive, send: Send) -> None:
    """Relay to the client in this task; if the client goes away first, the relay is cancelled
    (which closes the upstream request)."""
    task = asyncio.current_task()
    assert task is not None
    client = ClientSide(exchange, send, gw.config.gateway.keepalive_interval_s)
    client.start(receive, task)
    try:
        await _drive(gw.relay.run(exchange, pool), send, client)
    except asyncio.CancelledError:
        if not client.gone or task.uncancel() > 0:
            raise
    finally:
        client.stop()


async def _drive(items: Items, send: Send, client: ClientSide) -> None:
    done = False
    outcome: BaseException | None = None  # what broke the last pipe: sent back to the relay
    try:
        while True:
            try:
                item = await items.asend(outcome)
            except StopAsyncIteration:
                break
            outcome = None
            if isinstance(item, bytes):
                await send({"type": "http.response.body", "body": item, "more_body": True})
                continue
            if isinstance(item, Pipe):  # the body of a stream, relayed from the upstream's callback
                outcome = await item.run(send)
                continue
            await send({"type": "http.response.start", "status": item.status, "headers": item.headers})
            if item.body is not None:  # the whole answer; the generator ends after it
                client.finished = True
                await send({"type": "http.response.body", "body": item.body, "more_body": False})
                done = True
        client.finished = True
        if not done:
            await send({"type": "http.response.body", "body": b"", "more_body": False})
    finally:
        await items.aclose()
