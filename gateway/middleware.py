"""Plain ASGI middleware: an unexpected exception becomes an OpenAI error body, not a traceback
on the wire (the traceback goes to the log)."""

from __future__ import annotations

import logging

from gateway.asgi import ASGIApp, Message, Receive, Scope, Send, send_bytes
from gateway.errors import ApiError

log = logging.getLogger("zerogap.gateway")


class ErrorShield:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception:
            log.exception("unexpected error on %s %s", scope.get("method"), scope.get("path"))
            if not started:
                err = ApiError(500, "Internal gateway error; see the gateway's log.", "server_error")
                await send_bytes(send, 500, err.encoded())
