"""Lingering close, as nginx does it: a connection closed while its client is still sending.

When the gateway answers before it has read the whole request body (a 413 for a chunked body
over [gateway].max_body_bytes, a 408 for a body that stopped coming) and closes, the kernel
answers the bytes still coming with a reset, and a reset can destroy the answer before the
client reads it: the client sees "connection reset" instead of the error that says
what to fix. So such a close half-closes instead (the answer, then FIN), reads and discards what
the client still sends, and closes for good when the client closes its side, after
LINGER_S, or after LINGER_BYTES, whichever comes first (bounded: a client cannot hold it).

`LingeringTransport` wraps the connection's transport; the protocol tells it whether the client
may still be sending (`pending`) and routes incoming bytes to `discard` while it lingers. Every
other method is the transport's own, bound once (no indirection on the send path).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

LINGER_S = 2.0  # the longest a closed connection reads (and drops) what its client still sends
LINGER_BYTES = 4 * 1024 * 1024  # the most it drops before closing anyway


class LingeringTransport:
    """A transport whose close() lingers while `pending()` (the client may still be sending)."""

    def __init__(
        self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop, pending: Callable[[], bool]
    ) -> None:
        self._transport = transport
        self._loop = loop
        self._pending = pending
        self._discarded_bytes = 0
        self._timer: asyncio.TimerHandle | None = None
        self.lingering = False
        self.write = transport.write
        self.writelines = transport.writelines
        self.get_extra_info = transport.get_extra_info
        self.pause_reading = transport.pause_reading
        self.resume_reading = transport.resume_reading
        self.is_reading = transport.is_reading
        self.get_write_buffer_size = transport.get_write_buffer_size
        self.set_write_buffer_limits = transport.set_write_buffer_limits
        self.abort = transport.abort

    def __getattr__(self, name: str) -> Any:  # the rest of the transport's interface
        return getattr(self._transport, name)

    def is_closing(self) -> bool:
        return self.lingering or self._transport.is_closing()

    def close(self) -> None:
        transport = self._transport
        if self.lingering or transport.is_closing():
            return
        if not self._pending() or not transport.can_write_eof():
            transport.close()
            return
        self.lingering = True
        transport.write_eof()  # the answer is sent, then FIN
        if not transport.is_reading():
            transport.resume_reading()
        self._timer = self._loop.call_later(LINGER_S, self.close_now)

    def discard(self, data: bytes) -> None:
        """Bytes that came while lingering: dropped; past LINGER_BYTES the connection closes."""
        self._discarded_bytes += len(data)
        if self._discarded_bytes > LINGER_BYTES:
            self.close_now()

    def close_now(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._transport.close()

    def release(self) -> None:
        """The connection is lost: close, and drop `pending` (a method of the protocol, which
        holds this transport: the reference cycle would wait for the cycle collector)."""
        self.close_now()
        self._pending = _never


def _never() -> bool:
    return False
