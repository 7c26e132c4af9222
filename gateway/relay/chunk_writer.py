"""A streamed body's chunks written straight to the client's socket, as uvicorn's ASGI `send`
would write them, without a coroutine per chunk.

uvicorn's `send` for a body chunk of a chunked response, in the usual state (headers sent, the
socket not full, the client still there), is one `transport.write` of the chunk framed as
`<hex length>\\r\\n<bytes>\\r\\n`. Stepping that coroutine by hand (gateway/relay/pipe.py) still made a
coroutine, a message dict, a list and a StopIteration per relayed token. `chunk_writer(send)`
does that one write itself and says whether it could: in any other state (the socket full, the
client gone, headers not yet sent, a server other than uvicorn's httptools protocol) it returns
False and the caller sends through `send`, which then does what uvicorn does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from uvicorn.protocols.http.httptools_impl import HEADER_VALUE_RE, STATUS_LINE, RequestResponseCycle

from gateway.server.asgi import Send

ChunkWriter = Callable[[bytes], bool]
HeadWriter = Callable[[list[tuple[bytes, bytes]], bytes], bool]  # a 200 stream's head and its first chunk
HEAD_FIELDS = ("keep_alive", "default_headers", "access_log", "waiting_for_100_continue")
# What write() reads of uvicorn's cycle: a uvicorn that no longer has them gets no writer (send as before).
CYCLE_FIELDS = ("flow", "transport", "disconnected", "chunked_encoding", "response_complete", "response_started")
# checked against the cycle's own attributes (uvicorn sets each in its __init__) in one set comparison per request
_CYCLE_KEYS = frozenset(CYCLE_FIELDS)
_HEAD_KEYS = frozenset((*CYCLE_FIELDS, *HEAD_FIELDS))


def httptools_cycle(bound: Any, method: Any) -> Any:
    """uvicorn's httptools request cycle that `bound` is `method` of (its `send`, its `receive`);
    None for anything else (a test's callable, another server's)."""
    cycle: Any = getattr(bound, "__self__", None)
    if type(cycle) is not RequestResponseCycle or getattr(bound, "__func__", None) is not method:
        return None
    return cycle


def chunk_writer(send: Send) -> ChunkWriter | None:
    """A writer for the body chunks of the response `send` belongs to; None if `send` is not
    uvicorn's httptools `send` (a test's, or another server's): then every chunk goes through it."""
    cycle = httptools_cycle(send, RequestResponseCycle.send)
    if cycle is None:
        return None
    if not _CYCLE_KEYS <= cycle.__dict__.keys() or not hasattr(cycle.flow, "write_paused"):
        return None
    flow, transport = cycle.flow, cycle.transport

    def write(data: bytes) -> bool:
        """Write one non-empty chunk of a response that goes on (more_body); False: not done, use `send`."""
        if (
            flow.write_paused
            or cycle.disconnected
            or cycle.chunked_encoding is not True
            or cycle.response_complete
            or not cycle.response_started
        ):
            return False
        transport.write(b"%x\r\n%s\r\n" % (len(data), data))
        return True

    return write


def head_writer(send: Send) -> HeadWriter | None:
    """A writer of a streamed response's head (status 200, chunked) together with its first chunk,
    in one write, as uvicorn's `send` would write them in two (one system call less per request,
    and none of send's work per header); None if `send` is not uvicorn's httptools `send`. It says
    False (then send as before) unless the response has not started, the client is there, the
    socket is not full, and uvicorn writes no access log line for it."""
    cycle = httptools_cycle(send, RequestResponseCycle.send)
    if cycle is None or not _HEAD_KEYS <= cycle.__dict__.keys():
        return None
    flow, transport = cycle.flow, cycle.transport

    def write(headers: list[tuple[bytes, bytes]], first: bytes) -> bool:
        if cycle.response_started or cycle.disconnected or flow.write_paused or cycle.access_log:
            return False
        content = [STATUS_LINE[200]]
        for name, value in (*cycle.default_headers, *headers):
            if HEADER_VALUE_RE.search(value):  # as send refuses it (a client's x-request-id, say)
                return False
            content += [name, b": ", value, b"\r\n"]
        if not cycle.keep_alive:
            content.append(b"connection: close\r\n")
        content.append(b"transfer-encoding: chunked\r\n\r\n%x\r\n%s\r\n" % (len(first), first))
        cycle.response_started = True
        cycle.waiting_for_100_continue = False
        cycle.chunked_encoding = True
        transport.write(b"".join(content))
        return True

    return write
