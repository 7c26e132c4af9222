"""Plain ASGI middleware around the whole gateway.

ErrorShield: an unexpected exception becomes an OpenAI error body (500), not a traceback on
the wire (the traceback goes to the log). It does not wrap `send`, so it costs nothing per chunk.

FastPath: the completion endpoints by exact path, before Starlette's routing and its middleware
(each of which would wrap `send` for every streamed chunk); everything else goes to Starlette.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from gateway.server.asgi import ASGIApp, Receive, Scope, Send, send_bytes
from gateway.server.errors import ApiError

log = logging.getLogger("zerogap.gateway")


class ErrorShield:
    def __init__(self, app: Any) -> None:
        self.app = app

    @property
    def state(self) -> Any:
        return self.app.state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            await self.app(scope, receive, send)
        except Exception:
            log.exception("unexpected error on %s %s", scope.get("method"), scope.get("path"))
            err = ApiError(500, "Internal gateway error; see the gateway's log.", "server_error")
            with contextlib.suppress(Exception):  # fails if the response had started: nothing more to say
                await send_bytes(send, 500, err.encoded())


class FastPath:
    """Dispatch `routes` (exact paths) directly; the rest to `app`. `state` is the app's state."""

    def __init__(self, app: Any, routes: dict[str, ASGIApp]) -> None:
        self.app = app
        self.routes = routes

    @property
    def state(self) -> Any:
        return self.app.state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        endpoint = self.routes.get(scope["path"]) if scope["type"] == "http" else None
        if endpoint is None:
            await self.app(scope, receive, send)
            return
        scope["app"] = self.app
        await endpoint(scope, receive, send)
