"""The HTTP limits of [server] (gateway/server/http_limits.py): header size, header and body time, the
number of connections. The real app behind uvicorn as `zerogap gateway` configures it
(gateway.cli.uvicorn_config, uvloop), a real upstream, raw sockets on loopback; and once the
real `zerogap gateway` process."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from common.net import free_port
from tests.fixtures.upstream import Behavior, UpstreamServer
from tests.gateway.limited import (
    KEY,
    SMALL_BUFFER_BYTES,
    LimitedGateway,
    SourceConn,
    assert_error,
    eventually,
    limits_config,
    refused,
)
from tests.gateway.processes import GatewayProcess, write_config
from tests.gateway.raw_http import Conn, chat_request, parse, request

MAX_HEADER_BYTES = 32 * 1024
HEADER_TIMEOUT_S = 1.0
BODY_TIMEOUT_S = 2.0
MAX_CONNECTIONS = 4
MARGIN_S = 8.0  # a busy machine may be late; never early
CLOCK_SLACK_S = 0.1  # but a timer's start is read from the event loop's clock, cached at its last wake-up
IDLE_TIMEOUT_S = 30.0  # well past uvicorn's own keep-alive timeout (5 s), which it replaces
ENDLESS_CAP_BYTES = 8 * 1024 * 1024
HEALTH = request("GET", "/health")


@pytest.fixture(scope="module")
def upstream() -> Iterator[UpstreamServer]:
    with UpstreamServer(Behavior(interval_s=0.1, num_output_tokens=100), model="m") as up:
        yield up


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, upstream: UpstreamServer) -> Iterator[LimitedGateway]:
    server = (
        f"max_header_bytes = {MAX_HEADER_BYTES}\nheader_timeout_s = {HEADER_TIMEOUT_S}\n"
        f"body_timeout_s = {BODY_TIMEOUT_S}\nmax_connections = {MAX_CONNECTIONS}\n"
        f"max_connections_per_client = {MAX_CONNECTIONS}\nidle_connection_timeout_s = {IDLE_TIMEOUT_S}"
    )
    with LimitedGateway(limits_config(tmp_path_factory.mktemp("limits"), upstream.url, server)) as gw:
        yield gw


def test_an_endless_header_line_is_cut_near_the_limit(gateway: LimitedGateway) -> None:
    conn = Conn(gateway.port, sndbuf=SMALL_BUFFER_BYTES)
    sent = 0
    try:
        conn.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Endless: ")
        while sent < ENDLESS_CAP_BYTES:
            conn.sendall(b"a" * 1024)
            sent += 1024
    except OSError:  # reset, or a broken pipe: the server closed the connection
        pass
    raw, _ = conn.read_to_end()
    conn.close()
    print(f"{sent} bytes of one header line accepted")
    assert sent < 2 * MAX_HEADER_BYTES, f"{sent} bytes of one header line were accepted"
    if raw:  # the 431 came before the reset (as it does on Linux, but a reset may beat it)
        assert_error(raw, 431, "[server].max_header_bytes")


def test_a_header_section_over_the_limit_gets_431(gateway: LimitedGateway) -> None:
    padding = {f"X-Pad-{i}": "p" * 4000 for i in range(10)}  # 40 KB
    before = refused(gateway, "headers_too_large")
    with Conn(gateway.port) as conn:
        try:
            conn.sendall(request("GET", "/health", padding))
        except OSError:
            pass
        raw, _ = conn.read_to_end()
    assert_error(raw, 431, "[server].max_header_bytes")
    assert refused(gateway, "headers_too_large") == before + 1


def test_a_large_legal_header_section_works_twice_on_one_connection(gateway: LimitedGateway) -> None:
    padding = {f"X-Pad-{i}": "p" * 3800 for i in range(8)}  # 30 KB, sent at once and bit by bit
    with Conn(gateway.port) as conn:
        conn.sendall(chat_request(KEY, headers=padding))
        assert conn.read_response().status == 200
        raw = chat_request(KEY, headers=padding)
        for i in range(0, len(raw), 1000):
            conn.sendall(raw[i : i + 1000])
        response = conn.read_response()
    assert response.status == 200 and response.json()["choices"][0]["message"]["content"]


def trickle(conn: Conn, began_s: float, piece: bytes = b"") -> tuple[bytes, float]:
    """Send a header one byte (or `piece`) every 0.1 s until the server closes; what it answered,
    and when."""
    for byte in b"X-Slow: " + b"s" * 1000:
        try:
            conn.sendall(piece or bytes([byte]))
        except OSError:
            break
        time.sleep(0.1)
        if time.monotonic() - began_s > HEADER_TIMEOUT_S + MARGIN_S:
            raise AssertionError("still open long after header_timeout_s")
        if conn.readable():
            break
    return conn.read_to_end()


def test_slowloris_headers_are_cut_with_408(gateway: LimitedGateway) -> None:
    before = refused(gateway, "header_timeout")
    began_s = time.monotonic()  # the timer runs from the connection's start
    with Conn(gateway.port) as conn:
        conn.sendall(b"GET /health HTTP/1.1\r\n")
        raw, closed_s = trickle(conn, began_s)
    assert HEADER_TIMEOUT_S - CLOCK_SLACK_S <= closed_s - began_s < HEADER_TIMEOUT_S + MARGIN_S
    assert_error(raw, 408, "[server].header_timeout_s")
    assert refused(gateway, "header_timeout") == before + 1


def test_slowloris_on_a_keep_alive_connection_is_cut(gateway: LimitedGateway) -> None:
    with Conn(gateway.port) as conn:
        conn.sendall(HEALTH)
        assert conn.read_response().status == 200
        began_s = time.monotonic()  # the timer runs from the next request's first byte
        conn.sendall(b"GET /health HTTP/1.1\r\n")
        raw, closed_s = trickle(conn, began_s)
    assert HEADER_TIMEOUT_S - CLOCK_SLACK_S <= closed_s - began_s < HEADER_TIMEOUT_S + MARGIN_S
    assert_error(raw, 408, "[server].header_timeout_s")


def test_blank_lines_between_requests_are_cut_too(gateway: LimitedGateway) -> None:
    with Conn(gateway.port) as conn:
        conn.sendall(HEALTH)
        assert conn.read_response().status == 200
        began_s = time.monotonic()  # the parser skips blank lines: no request begins, yet time runs
        raw, closed_s = trickle(conn, began_s, b"\r\n")
    assert HEADER_TIMEOUT_S - CLOCK_SLACK_S <= closed_s - began_s < HEADER_TIMEOUT_S + MARGIN_S
    assert_error(raw, 408, "[server].header_timeout_s")


def test_a_stalled_pipelined_request_is_cut(gateway: LimitedGateway) -> None:
    with Conn(gateway.port) as conn:  # its first bytes come in the read that ends the one before
        began_s = time.monotonic()
        conn.sendall(HEALTH + b"GET /health HTTP/1.1\r\nX-Slow: s")
        assert conn.read_response().status == 200
        raw, closed_s = conn.read_to_end()
    assert HEADER_TIMEOUT_S - CLOCK_SLACK_S <= closed_s - began_s < HEADER_TIMEOUT_S + MARGIN_S
    assert_error(raw, 408, "[server].header_timeout_s")  # not uvicorn's silent keep-alive close


def test_pipelined_requests_are_answered_before_a_refusal(gateway: LimitedGateway) -> None:
    padding = {f"X-Pad-{i}": "p" * 4000 for i in range(10)}
    with Conn(gateway.port) as conn:
        conn.sendall(HEALTH + request("GET", "/health", padding))
        assert conn.read_response().status == 200
        raw, _ = conn.read_to_end()
    if raw:  # the 431 comes when the oversized headers were whole in one read, else only the close
        assert_error(raw, 431, "[server].max_header_bytes")


def test_a_silent_connection_is_closed_without_an_answer(gateway: LimitedGateway) -> None:
    before = refused(gateway, "silent_connection")
    began_s = time.monotonic()
    with Conn(gateway.port) as conn:
        raw, closed_s = conn.read_to_end()
    assert raw == b"" and HEADER_TIMEOUT_S - CLOCK_SLACK_S <= closed_s - began_s < HEADER_TIMEOUT_S + MARGIN_S
    assert refused(gateway, "silent_connection") == before + 1


def test_an_idle_keep_alive_connection_outlives_the_header_timeout(gateway: LimitedGateway) -> None:
    with Conn(gateway.port) as conn:
        conn.sendall(HEALTH)
        assert conn.read_response().status == 200
        time.sleep(6.0)  # idle: idle_connection_timeout_s applies (not the header timer, nor uvicorn's 5 s)
        conn.sendall(HEALTH)
        assert conn.read_response().status == 200


def test_a_slow_body_gets_408(gateway: LimitedGateway) -> None:
    raw = chat_request(KEY)
    before = refused(gateway, "body_timeout")
    with Conn(gateway.port) as conn:
        conn.sendall(raw[:-10])  # the headers and most of the body, then nothing
        began_s = time.monotonic()
        answer, closed_s = conn.read_to_end()
    assert BODY_TIMEOUT_S - CLOCK_SLACK_S <= closed_s - began_s < BODY_TIMEOUT_S + MARGIN_S
    assert_error(answer, 408, "[server].body_timeout_s")
    assert refused(gateway, "body_timeout") == before + 1


def test_a_slow_body_after_an_answer_is_cut(gateway: LimitedGateway) -> None:
    with Conn(gateway.port) as conn:  # answered (405) without the body being read; then it trickles
        conn.sendall(request("POST", "/health", {"Content-Length": "100"}) + b"x" * 10)
        began_s = time.monotonic()
        assert conn.read_response().status == 405
        conn.sendall(b"x" * 10)
        raw, closed_s = conn.read_to_end()
    assert raw == b"" and closed_s - began_s < BODY_TIMEOUT_S + MARGIN_S


def test_a_body_in_parts_within_the_deadline_works(gateway: LimitedGateway) -> None:
    raw = chat_request(KEY)
    with Conn(gateway.port) as conn:
        conn.sendall(raw[:-10])
        time.sleep(0.2)
        conn.sendall(raw[-10:])
        assert conn.read_response().status == 200


def test_a_stream_longer_than_the_timeouts_works(gateway: LimitedGateway) -> None:
    with Conn(gateway.port) as conn:
        began_s = time.monotonic()
        raw = chat_request(KEY, max_tokens=40, stream=True)
        conn.sendall(raw[:-10])  # in two parts: the body deadline runs, and must end with the body
        time.sleep(0.1)
        conn.sendall(raw[-10:])
        response = conn.read_response()
        assert time.monotonic() - began_s > BODY_TIMEOUT_S + HEADER_TIMEOUT_S  # 40 tokens, 0.1 s apart
        conn.sendall(HEALTH)  # and the connection still serves
        assert conn.read_response().status == 200
    assert response.status == 200 and response.body.rstrip().endswith(b"data: [DONE]")
    assert response.body.count(b'"content"') >= 40


def test_beyond_max_connections_a_request_gets_503(gateway: LimitedGateway) -> None:
    eventually(lambda: gateway.num_connections() == 0)  # earlier tests' closes are done (the scrape needs a slot)
    before = refused(gateway, "too_many_connections")
    assert eventually(lambda: gateway.num_connections() == 0)  # the scrape's connection closed too
    held = [Conn(gateway.port) for _ in range(MAX_CONNECTIONS)]
    try:
        for conn in held:
            conn.sendall(HEALTH)
            assert conn.read_response().status == 200
        with SourceConn(gateway.port, "127.0.0.2") as extra:  # another client: its own count is not full
            extra.sendall(HEALTH)
            raw, _ = extra.read_to_end()
        assert_error(raw, 503, "[server].max_connections")
        assert parse(raw).headers["retry-after"] == "1"
        held.pop().close()
        assert eventually(lambda: gateway.num_connections() < MAX_CONNECTIONS)
        with Conn(gateway.port) as again:
            again.sendall(HEALTH)
            assert again.read_response().status == 200
    finally:
        for conn in held:
            conn.close()
    assert refused(gateway, "too_many_connections") == before + 1


def test_the_gateway_process_applies_the_limits(tmp_path: Path, upstream: UpstreamServer) -> None:
    port = free_port()
    server = f"max_header_bytes = 8192\nheader_timeout_s = {HEADER_TIMEOUT_S}\n"
    config = write_config(tmp_path / "config.toml", port, upstream.url, {}, server=server)
    with GatewayProcess(config, port) as gw:
        with Conn(port) as conn:
            conn.sendall(request("GET", "/health", {"X-Pad": "p" * 9000}))
            raw, _ = conn.read_to_end()
        assert_error(raw, 431, "8192 bytes")
        with Conn(port) as conn:
            began_s = time.monotonic()
            conn.sendall(b"GET /health HTTP/1.1\r\nX-Slow: s")
            raw, closed_s = conn.read_to_end()
        assert_error(raw, 408, "[server].header_timeout_s")
        assert closed_s - began_s < HEADER_TIMEOUT_S + MARGIN_S
        with Conn(port) as conn:  # pipelined: the first is answered; the second is not served
            conn.sendall(request("GET", "/health") + request("GET", "/health", {"X-Pad": "p" * 9000}))
            assert conn.read_response().status == 200
            raw, _ = conn.read_to_end()
        if raw:  # the 431 after the 200 (both came in one read, as on loopback), or only the close
            assert_error(raw, 431, "8192 bytes")
        with Conn(port) as conn:
            conn.sendall(request("GET", "/health"))
            assert conn.read_response().status == 200
    assert "Traceback" not in gw.logs()
