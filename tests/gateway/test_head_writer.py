"""gateway/relay/chunk_writer.head_writer on uvicorn's real RequestResponseCycle: a stream's head and
first chunk written at once are the very bytes uvicorn's send writes for them in two sends (with
its default headers, and `connection: close` when the cycle is not kept alive), the cycle is left
in send's state (a later chunk and the end go through send as before), and in every state where
send would do otherwise the writer writes nothing and says so."""

from __future__ import annotations

from typing import Any

from gateway.relay.chunk_writer import head_writer
from gateway.relay.exchange import SSE_HEADERS
from tests.gateway.test_pipe_chunk_writer import CHUNK, cycle

DEFAULTS = [(b"server", b"uvicorn"), (b"date", b"Mon, 07 Dec 2026 07:00:00 GMT")]
HEAD = [*SSE_HEADERS, (b"x-request-id", b"req-1"), (b"x-zerogap-overhead-ms", b"0.412")]


def a_cycle(keep_alive: bool = True) -> tuple[Any, Any]:
    c, out = cycle()
    c.default_headers = list(DEFAULTS)
    c.keep_alive = keep_alive
    return c, out


async def test_head_and_first_chunk_in_one_write_are_what_send_writes_in_two() -> None:
    for keep_alive in (True, False):
        direct, direct_out = a_cycle(keep_alive)
        via_send, send_out = a_cycle(keep_alive)
        write = head_writer(direct.send)
        assert write is not None and write(HEAD, CHUNK) is True
        await via_send.send({"type": "http.response.start", "status": 200, "headers": HEAD})
        await via_send.send({"type": "http.response.body", "body": CHUNK, "more_body": True})
        assert len(direct_out.written) == 1 and direct_out.written == [b"".join(send_out.written)]
        assert (b"connection: close\r\n" in direct_out.written[0]) is not keep_alive
        for c in (direct, via_send):  # the rest of the response goes through send alike
            await c.send({"type": "http.response.body", "body": CHUNK, "more_body": True})
            c.transport.close = lambda: None  # not kept alive: send closes at the end
            await c.send({"type": "http.response.body", "body": b"", "more_body": False})
        assert b"".join(direct_out.written) == b"".join(send_out.written)
        assert direct.response_complete and via_send.response_complete


async def test_in_every_other_state_nothing_is_written() -> None:
    c, out = a_cycle()
    write = head_writer(c.send)
    assert write is not None
    c.flow.pause_writing()
    assert write(HEAD, CHUNK) is False
    c.flow.resume_writing()
    c.disconnected = True
    assert write(HEAD, CHUNK) is False
    c.disconnected = False
    c.access_log = True  # uvicorn logs the response: its send does it
    assert write(HEAD, CHUNK) is False
    c.access_log = False
    assert write([(b"x-request-id", b"a\r\nb")], CHUNK) is False  # send refuses such a value: so it does
    assert out.written == [] and not c.response_started
    await c.send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
    assert write(HEAD, CHUNK) is False  # the head went already (a keep-alive comment's)
    assert head_writer(lambda message: None) is None  # type: ignore[arg-type,return-value]  # not uvicorn's send
