"""gateway/relay/chunk_writer.py on uvicorn's real RequestResponseCycle: a chunk written directly is the
very bytes uvicorn's send writes for it, and in every state where send would do more (headers
not sent, the socket full, the client gone, the response complete, a fixed Content-Length) the
writer writes nothing and says so."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from gateway.relay.chunk_writer import chunk_writer
from gateway.relay.exchange import SSE_HEADERS

CHUNK = b'data: {"choices":[{"index":0,"text":" t1"}]}\n\n'


class Transport:
    """What the cycle writes, and the state uvicorn's FlowControl reads."""

    def __init__(self) -> None:
        self.written: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.written.append(bytes(data))

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...

    def is_closing(self) -> bool:
        return False


def cycle(method: str = "POST") -> tuple[Any, Transport]:
    """uvicorn's cycle (typed Any: its send and the fake transport are not the ASGI types)."""
    transport: Any = Transport()
    scope: Any = {"method": method, "http_version": "1.1", "path": "/v1/completions", "query_string": b""}
    log = logging.getLogger("test")
    c = RequestResponseCycle(
        scope, transport, FlowControl(transport), log, log, False, [], asyncio.Event(), False, True, lambda: None
    )
    return c, transport


async def test_a_chunk_written_directly_is_what_uvicorns_send_writes() -> None:
    direct, direct_out = cycle()
    via_send, send_out = cycle()
    for c in (direct, via_send):
        await c.send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
    write = chunk_writer(direct.send)
    assert write is not None
    assert write(CHUNK) is True
    await via_send.send({"type": "http.response.body", "body": CHUNK, "more_body": True})
    assert direct_out.written == send_out.written
    assert direct_out.written[-1] == b"%x\r\n%s\r\n" % (len(CHUNK), CHUNK)


async def test_in_every_other_state_nothing_is_written_and_send_is_left_to_do_it() -> None:
    c, out = cycle()
    write = chunk_writer(c.send)
    assert write is not None
    assert write(CHUNK) is False and out.written == []  # the headers have not gone yet
    await c.send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
    num_written = len(out.written)
    c.flow.pause_writing()  # the client's socket is full: send waits, the writer does not write
    assert write(CHUNK) is False
    c.flow.resume_writing()
    c.disconnected = True
    assert write(CHUNK) is False
    c.disconnected = False
    assert write(CHUNK) is True and len(out.written) == num_written + 1
    await c.send({"type": "http.response.body", "body": b"", "more_body": False})
    assert write(CHUNK) is False  # the response is complete

    fixed, fixed_out = cycle()  # a response with a Content-Length is not chunked: not for the writer
    fixed_writer = chunk_writer(fixed.send)
    assert fixed_writer is not None
    await fixed.send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"3")]})
    assert fixed_writer(b"abc") is False and len(fixed_out.written) == 1


async def test_a_send_that_is_not_uvicorns_gets_no_writer() -> None:
    async def send(message: Any) -> None: ...

    c, _ = cycle()
    assert chunk_writer(send) is None
    assert chunk_writer(c.receive) is None  # the cycle's, but not its send


async def test_a_uvicorn_whose_cycle_lacks_a_field_the_writer_reads_gets_no_writer() -> None:
    """A later uvicorn that renames what write() reads: chunks go through send, as before."""
    c, _ = cycle()
    assert chunk_writer(c.send) is not None
    del c.chunked_encoding
    assert chunk_writer(c.send) is None
