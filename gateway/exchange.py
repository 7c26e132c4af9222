"""One request's exchange with its client, as the proxy (client side), the relay (backend side)
and the pipe (a stream's body) share it: what has been sent, when, and what it cost."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.auth import Principal
    from gateway.request import Call

SSE_HEADERS = [
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


@dataclass
class Reply:
    """What goes to the client first: the status and headers, and the whole body when the answer
    is not a stream (body None: the stream's bytes follow)."""

    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes | None = None


def json_reply(status: int, body: bytes) -> Reply:
    return Reply(status, [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())], body)


@dataclass(slots=True)
class Charge:
    """What one request is charged (usage, tpm, token metrics): the backend's own figures when it
    reported them (exact), else the completion tokens counted from the relayed chunks and the
    prompt estimated from its bytes (see gateway/charging.py)."""

    prompt_tokens: int
    completion_tokens: int
    exact: bool


@dataclass
class Exchange:
    """One request's state, filled in as it goes and read in the relay's `finally` (metrics, usage)."""

    who: Principal
    call: Call
    estimate: int  # tokens reserved against the key's tpm limit
    t0_s: float = field(default_factory=time.monotonic)
    status: int = 502
    backend: str = "none"
    started: bool = False  # status and headers went to the client
    first_s: float | None = None
    last_s: float | None = None
    charge: Charge | None = None  # None: nothing to charge (no answer came, or the backend refused it)
    replied: bool = False  # the relay has its answer (no more keep-alives while waiting for it)
    continue_ok: bool = True  # the client did not opt out of stream continuation (X-Zerogap-Continue: off)

    def start_stream(self) -> bool:
        """Marks the response started as an SSE stream; True if the caller is to send the headers
        (nobody has yet: the client side's keep-alive or the relay's first chunk, whichever is first)."""
        if self.started:
            return False
        self.started = True
        return True
