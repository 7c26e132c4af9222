"""The ASGI endpoints of the completion APIs: check the request, then hand it to the relay."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from gateway.endpoints.request import parse_call
from gateway.relay.client_side import ClientSide
from gateway.relay.exchange import Exchange
from gateway.relay.responder import Responder
from gateway.server.asgi import ClientGone, Receive, Scope, Send, header, read_body
from gateway.server.errors import ApiError
from gateway.tenants.admission import Admission, admit_head, admit_model, limit, refuse
from gateway.tenants.limits import estimate_tokens

if TYPE_CHECKING:
    from gateway.gateway import Gateway
    from gateway.pool.model_pool import ModelPool


class Completions:
    """POST /v1/chat/completions (chat=True) or /v1/completions."""

    inline = True  # the gateway's protocol runs it from the read that completed the request (inline_task.py)

    def __init__(self, chat: bool) -> None:
        self.chat = chat
        self.path = "/v1/chat/completions" if chat else "/v1/completions"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        arrived_s = time.monotonic()  # TTFT and duration count from here, admission included
        gw: Gateway = scope["app"].state.gateway
        admission = Admission(arrived_s)
        gw.observer.begin(scope, admission.marks)
        try:
            try:
                exchange, pool = await self._admit(gw, scope, receive, admission)
            except ApiError as exc:
                await refuse(gw, scope, send, exc, admission)
                gw.observer.refused(scope, admission.marks, admission.key, admission.model, exc, self.path)
                return
            except ClientGone:  # before its body was all here: its request log line says so
                gw.observer.refused(scope, admission.marks, admission.key, admission.model, GONE, self.path)
                return
            gw.observer.admitted(scope, admission.marks, exchange)
            await serve(gw, exchange, pool, receive, send)
        finally:
            admission.release(gw)

    async def _admit(
        self, gw: Gateway, scope: Scope, receive: Receive, admission: Admission
    ) -> tuple[Exchange, ModelPool]:
        """The shared admission (gateway/tenants/admission.py): the key, its expiry, rpm and concurrency
        from the headers; then the body, the model; then tpm, which needs the parsed body."""
        who = await admit_head(gw, scope, admission)
        raw = await read_body(receive, scope, gw.config.gateway.max_body_bytes)
        admission.body_read = True
        call = parse_call(raw, self.path, self.chat, gw.config.gateway)
        admission.marks.body_s = time.monotonic()
        pool = admit_model(gw, who, call.model, admission)
        estimate = estimate_tokens(len(raw), call.budget_tokens)
        if who.limits.tpm is not None:
            await limit(gw, who, call.model, gw.limiter.reserve(who, estimate, call.budget_tokens))
        admission.marks.done_s = time.monotonic()
        continue_ok = header(scope, b"x-zerogap-continue") not in NO_CONTINUE
        return Exchange(who, call, estimate, t0_s=admission.marks.t0_s, continue_ok=continue_ok), pool


GONE = ApiError(499, "The client went away before its request was read.", code="client_gone")
NO_CONTINUE = (b"off", b"false", b"0", b"no")  # X-Zerogap-Continue: a client that would rather see the break


async def serve(gw: Gateway, exchange: Exchange, pool: ModelPool, receive: Receive, send: Send) -> None:
    """Relay to the client in this task; if the client goes away first, the relay is cancelled
    (which closes the upstream request)."""
    task = asyncio.current_task()
    assert task is not None
    client = ClientSide(exchange, send, gw.config.gateway.keepalive_interval_s)
    client.start(receive, task)
    out = Responder(send, client)
    try:
        await gw.relay.run(exchange, pool, out)
        await out.end()
    except asyncio.CancelledError:
        if not client.gone or task.uncancel() > 0:
            raise
    finally:
        client.stop()
