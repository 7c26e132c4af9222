"""One admission chain for every endpoint that uses a model on a key's behalf: the completion
endpoints (gateway/endpoints/completions.py) and POST /tokenize, /detokenize (gateway/endpoints/tokenize.py).

At the headers, before the body is read (`admit_head`): the method, the key and its expiry
(401), the Content-Type (415), the declared length (413), then the key's rpm and
max_concurrency (429). The concurrency slot is held until the request really ends
(`Admission.release`, in the endpoint's finally). After the body (`admit_model`): the model.
A model no pool serves and a model the key may not use get the same 404 `model_not_found`, with
the same message, and the same metric label `unknown`: a key cannot tell the pool's other
models from names that do not exist (OpenAI answers a model an organization cannot see so).

A refusal (`refuse`) is counted in zerogap_requests_total with backend `none`, logged at debug,
and answered in the OpenAI shape; a body still unread and unbounded has its connection closed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable
from typing import TYPE_CHECKING, TypeVar

from gateway.observe.trace_context import Marks
from gateway.server.asgi import Scope, Send, check_declared_length, client_host, header, send_error
from gateway.server.errors import LIMIT_OF_CODE, ApiError, unknown_model
from gateway.tenants.limits import Slot, limited_at_head

if TYPE_CHECKING:
    from gateway.gateway import Gateway
    from gateway.pool.model_pool import ModelPool
    from gateway.tenants.auth import Principal

log = logging.getLogger("zerogap.gateway.admission")
T = TypeVar("T")

UNKNOWN = "unknown"  # the model label of a model no pool serves or the key may not use


def method_not_allowed(allowed: str) -> ApiError:
    return ApiError(
        405, f"Method not allowed here; use {allowed}.", code="method_not_allowed", headers={"Allow": allowed}
    )


def check_content_type(scope: Scope) -> None:
    value = header(scope, b"content-type")
    if value is None or value.split(b";")[0].strip().lower() != b"application/json":
        shown = value.decode(errors="replace") if value else "none"
        raise ApiError(415, f"Content-Type must be application/json (got {shown}).", code="unsupported_media_type")


def unbounded_body(scope: Scope, max_bytes: int) -> bool:
    """The request's body, unread, has no length (chunked) or one above max_bytes: after a refusal
    the server would drain it to the end to keep the connection; better to close it."""
    declared = header(scope, b"content-length")
    if declared is None:
        return header(scope, b"transfer-encoding") is not None
    return not declared.isdigit() or int(declared) > max_bytes


class Admission:
    """What one request's admission holds and knows: its labels so far, whether its body was read,
    its concurrency slot (given back by `release`, whatever way the request ends), its ids, and
    when each step ended (time.monotonic(); the spans of a traced request)."""

    __slots__ = ("backend", "body_read", "key", "marks", "model", "slot")

    def __init__(self, t0_s: float = 0.0) -> None:
        self.slot: Slot | None = None
        self.body_read = False
        self.model = "none"  # what is known when a request is refused
        self.key = "none"
        self.backend = "none"
        self.marks = Marks(t0_s)  # its ids (the completion endpoints') and times

    def release(self, gw: Gateway) -> None:
        if self.slot is not None:  # the request has really ended: its slot is free
            slot, self.slot = self.slot, None
            gw.limiter.release(slot)


async def admit_head(gw: Gateway, scope: Scope, admission: Admission) -> Principal:
    """The key, its expiry, rpm and concurrency from the headers, before the body is read (a
    refused request is answered without reading it)."""
    if scope["method"] != "POST":
        raise method_not_allowed("POST")
    who = await gw.auth.authenticate(header(scope, b"authorization"), client_host(scope))
    admission.key = who.name
    admission.marks.auth_s = time.monotonic()
    check_content_type(scope)
    check_declared_length(scope, gw.config.gateway.max_body_bytes)  # 413 before the limits: a refusal takes nothing
    if limited_at_head(who):
        admission.slot = await limit(gw, who, "none", gw.limiter.admit(who))
    admission.marks.head_s = time.monotonic()
    return who


def admit_model(gw: Gateway, who: Principal, model: str, admission: Admission) -> ModelPool:
    """The model's pool, if the key may use it; one 404 for a model that is not there and for one
    that is not the key's."""
    pool = gw.router.pools.get(model) if who.may_use(model) else None
    admission.model = model if pool is not None else UNKNOWN  # never a client's arbitrary string
    if pool is None:
        raise unknown_model(model)
    return pool


async def limit(gw: Gateway, who: Principal, model: str, check: Awaitable[T]) -> T:
    """The limiter's answer; a refusal is counted in zerogap_ratelimited_total{limit}."""
    try:
        return await check
    except ApiError as exc:
        if exc.status == 429:
            gw.metrics.ratelimited.labels(model, who.name, LIMIT_OF_CODE.get(exc.code or "", "other")).inc()
        raise


async def refuse(
    gw: Gateway, scope: Scope, send: Send, exc: ApiError, admission: Admission, waited_s: float = 0.0
) -> None:
    """Count, log (debug) and answer a refused request; `waited_s`: the time it waited on a backend
    (/tokenize's answered with an error), not the gateway's own."""
    a = admission
    gw.metrics.requests.labels(a.model, a.backend, a.key, str(exc.status)).inc()
    log.debug("refused %s model=%s key=%s: %s %s", scope["path"], a.model, a.key, exc.status, exc)
    if not a.body_read and unbounded_body(scope, gw.config.gateway.max_body_bytes):
        exc.headers = {**exc.headers, "Connection": "close"}
    marks = a.marks
    if marks.request_id:  # the id, and the gateway's time (all of it was, but a backend's wait)
        now = time.monotonic()
        if marks.done_s is None:  # refused at its admission
            marks.done_s = now
        overhead = f"{1000.0 * (now - marks.t0_s - waited_s):.3f}"
        exc.headers = {**exc.headers, "x-request-id": marks.request_id, "x-zerogap-overhead-ms": overhead}
    await send_error(send, exc)
