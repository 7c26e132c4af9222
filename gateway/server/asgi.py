"""Small ASGI helpers: read a bounded body, send bytes or an ApiError."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from gateway.server.body_scan import BodyScan, ScannedBody
from gateway.server.errors import ApiError

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
TooLarge = Callable[[int], ApiError]  # the 413 for a body over its bound (max_bytes)
SCAN_SLICE = 64 * 1024  # body bytes scanned in one step of the event loop (at most ~3 ms, ~0.1 ms for text)


class ClientGone(Exception):
    """The client disconnected while we were reading its request."""


def header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value)
    return None


def client_host(scope: Scope) -> str | None:
    """The client's address (host only), as the server saw it."""
    client = scope.get("client")
    return str(client[0]) if client else None


def check_declared_length(scope: Scope, max_bytes: int, error: TooLarge | None = None) -> None:
    """413 for a Content-Length above max_bytes, before a byte of the body is read."""
    declared = header(scope, b"content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise (error or too_large)(max_bytes)


async def read_body(receive: Receive, scope: Scope, max_bytes: int, error: TooLarge | None = None) -> ScannedBody:
    """The whole body, refused with `error(max_bytes)` (default: too_large) as soon as it is known
    to exceed max_bytes: from its Content-Length, or while it arrives (never read past the limit).
    Each chunk is scanned as it comes (gateway/server/body_scan.py: what decoding it will cost), so that
    no one step of the event loop pays for a whole large body."""
    check_declared_length(scope, max_bytes, error)
    chunks: list[bytes] = []
    scan = BodyScan()
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > max_bytes:
            raise (error or too_large)(max_bytes)
        if len(chunk) <= SCAN_SLICE:
            scan.feed(chunk)
        else:  # a read can bring more: scan it a slice per step of the loop
            for start in range(0, len(chunk), SCAN_SLICE):
                scan.feed(chunk[start : start + SCAN_SLICE])
                await asyncio.sleep(0)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return ScannedBody(chunks[0] if len(chunks) == 1 else b"".join(chunks), scan)


def too_large(max_bytes: int) -> ApiError:
    return ApiError(
        413,
        f"Request body is larger than {max_bytes} bytes ([gateway].max_body_bytes). Send a smaller request.",
        code="request_too_large",
    )


async def send_bytes(
    send: Send,
    status: int,
    body: bytes,
    headers: dict[str, str] | None = None,
    content_type: bytes = b"application/json",
) -> None:
    raw = [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]
    raw += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def send_error(send: Send, error: ApiError) -> None:
    await send_bytes(send, error.status, error.encoded(), error.headers)
