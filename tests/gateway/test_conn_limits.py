"""No client stalls another at the connection level (issue 35): [server] max_connections_per_client,
idle_connection_timeout_s, a refusal that closes its connection without waiting for the body on
every endpoint, and forwarded_allow_ips (X-Forwarded-For only from trusted proxies).

The gateway as `zerogap gateway` configures uvicorn, on a thread (tests/gateway/limited.py), and
the real `zerogap gateway` process (one, and --workers 2); raw sockets from several loopback
addresses (Linux routes all of 127/8 to lo), so that each address is another client. Verdicts wait
for events (a close, an answer) with generous deadlines, where the rule broken would leave the
connection open for an hour (timeouts set to 3600 s) or answer otherwise."""

from __future__ import annotations

import json
import select
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from common.net import free_port
from tests.fixtures.upstream import UpstreamServer
from tests.gateway.limited import (
    KEY,
    LimitedGateway,
    SourceConn,
    assert_error,
    eventually,
    limits_config,
    refused,
)
from tests.gateway.processes import UNIFIED, GatewayProcess, metric_sum, write_config
from tests.gateway.raw_http import Conn, chat_request, parse, request

HOUR_S = 3600  # a timeout that must not be what closes a connection in these tests
PER_CLIENT = 3
ADMIN = "admin-conn-limits-key-01"
CLOSE_DEADLINE_S = 30.0  # generous: the rule closes at once (or after a 2 s linger)
HEALTH = request("GET", "/health")


@pytest.fixture(scope="module")
def upstream() -> Iterator[UpstreamServer]:
    with UpstreamServer(model="m") as up:
        yield up


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, upstream: UpstreamServer) -> Iterator[LimitedGateway]:
    """Only the rules under test close a connection: every timeout is an hour."""
    server = (
        f"max_connections = 50\nmax_connections_per_client = {PER_CLIENT}\nidle_connection_timeout_s = {HOUR_S}\n"
        f'header_timeout_s = {HOUR_S}\nbody_timeout_s = {HOUR_S}\nadmin_key = "{ADMIN}"'
    )
    with LimitedGateway(limits_config(tmp_path_factory.mktemp("conns"), upstream.url, server)) as gw:
        yield gw


def per_client_count(gateway: LimitedGateway, source: str) -> int:
    """The connections the gateway counts for `source` (its protocol class holds the counts)."""
    return int(gateway.server.config.http.counts.of(source))  # type: ignore[union-attr]


# --- max_connections_per_client --------------------------------------------------------------------


def test_beyond_its_connections_a_client_is_answered_503_at_once(gateway: LimitedGateway) -> None:
    """The client's next connection gets the 503 without sending a byte (it cannot hold a slot
    until a timeout); one that sends its request at once reads the 503 too (not a reset); another
    address is served meanwhile; a closed connection frees its client's slot."""
    client, other = "127.0.0.5", "127.0.0.6"
    before = refused(gateway, "too_many_connections_per_client", other)
    held = [SourceConn(gateway.port, client) for _ in range(PER_CLIENT)]  # silent
    try:
        assert eventually(lambda: per_client_count(gateway, client) == PER_CLIENT)
        with SourceConn(gateway.port, client) as extra:
            raw, _ = extra.read_to_end()  # sends nothing: answered and closed all the same
        assert_error(raw, 503, "[server].max_connections_per_client")
        assert parse(raw).json()["error"]["code"] == "too_many_connections"
        assert parse(raw).headers["retry-after"] == "1"
        with SourceConn(gateway.port, client) as eager:
            eager.sendall(HEALTH)
            raw, _ = eager.read_to_end()
        assert_error(raw, 503, "[server].max_connections_per_client")
        with SourceConn(gateway.port, other) as conn:
            conn.sendall(HEALTH)
            assert conn.read_response().status == 200
        for conn in held:  # still open and still served: the refusals took nothing from them
            assert not conn.readable()
        held[0].sendall(HEALTH)
        assert held[0].read_response().status == 200
        held.pop().close()
        assert eventually(lambda: per_client_count(gateway, client) < PER_CLIENT)
        with SourceConn(gateway.port, client) as again:
            again.sendall(HEALTH)
            assert again.read_response().status == 200
    finally:
        for conn in held:
            conn.close()
    assert refused(gateway, "too_many_connections_per_client", other) == before + 2


def test_silent_sockets_from_one_address_do_not_stall_other_clients(tmp_path: Path, upstream: UpstreamServer) -> None:
    """The attack of 2026-12-07 on a real `zerogap gateway`: 205 silent sockets from one address
    with max_connections = 200. Beyond its 5, the attacker's connections are refused at once, so
    /health and a completion from other addresses are served while its 5 stay open."""
    port = free_port()
    server = (
        f"max_connections = 200\nmax_connections_per_client = 5\n"
        f"idle_connection_timeout_s = {HOUR_S}\nheader_timeout_s = {HOUR_S}"
    )
    config = write_config(tmp_path / "config.toml", port, upstream.url, {}, server=server)
    attacker, other, scraper = "127.0.0.11", "127.0.0.12", "127.0.0.13"
    with GatewayProcess(config, port) as gw:
        silent = []
        try:
            for _ in range(205):
                silent.append(SourceConn(port, attacker))

            def refusals() -> float:
                with SourceConn(port, scraper) as conn:
                    conn.sendall(request("GET", "/metrics"))
                    text = conn.read_response().body.decode()
                return metric_sum(text, "zerogap_http_refused_total", reason="too_many_connections_per_client")

            assert eventually(lambda: refusals() == 200, timeout_s=CLOSE_DEADLINE_S), refusals()
            with SourceConn(port, other) as conn:
                conn.sendall(HEALTH)
                assert conn.read_response().status == 200
                conn.sendall(chat_request(UNIFIED))
                response = conn.read_response()
            assert response.status == 200 and response.json()["choices"][0]["message"]["content"]
            answered = [conn for conn in silent if conn.readable()]
            assert len(answered) == 200  # the 5 first kept open, every other one answered
            raw, _ = answered[-1].read_to_end()
            assert_error(raw, 503, "[server].max_connections_per_client")
        finally:
            for conn in silent:
                conn.close()
    assert "Traceback" not in gw.logs()


# --- idle_connection_timeout_s -------------------------------------------------------------------


@pytest.fixture(scope="module")
def idle_gateway(tmp_path_factory: pytest.TempPathFactory, upstream: UpstreamServer) -> Iterator[LimitedGateway]:
    server = f"idle_connection_timeout_s = 1\nheader_timeout_s = {HOUR_S}\nbody_timeout_s = {HOUR_S}"
    with LimitedGateway(limits_config(tmp_path_factory.mktemp("idle"), upstream.url, server)) as gw:
        yield gw


def test_a_new_connection_that_sends_nothing_is_closed_silently(idle_gateway: LimitedGateway) -> None:
    before = refused(idle_gateway, "silent_connection")
    with SourceConn(idle_gateway.port, "127.0.0.21", timeout_s=CLOSE_DEADLINE_S) as conn:
        raw, _ = conn.read_to_end()  # the header timeout (an hour) cannot be what closed it
    assert raw == b""
    assert refused(idle_gateway, "silent_connection") == before + 1


def test_a_keep_alive_connection_idle_between_requests_is_closed(idle_gateway: LimitedGateway) -> None:
    with SourceConn(idle_gateway.port, "127.0.0.22", timeout_s=CLOSE_DEADLINE_S) as conn:
        conn.sendall(HEALTH)
        assert conn.read_response().status == 200
        raw, _ = conn.read_to_end()
    assert raw == b""


def test_a_request_begun_within_the_idle_timeout_keeps_the_header_timeout(idle_gateway: LimitedGateway) -> None:
    """Its first bytes came in time: the idle timeout has passed, the request is not cut by it."""
    with SourceConn(idle_gateway.port, "127.0.0.23") as conn:
        conn.sendall(b"GET /health HTTP/1.1\r\n")
        time.sleep(2.5)  # past the idle timeout (1 s)
        conn.sendall(b"Host: 127.0.0.1\r\n\r\n")
        assert conn.read_response().status == 200


# --- a refusal closes its connection without waiting for the body ------------------------------------


def chunked_head(path: str, headers: dict[str, str]) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", "Transfer-Encoding: chunked"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def trickle_until_closed(conn: Conn, piece: bytes) -> bool:
    """Send `piece` every 50 ms until the server closes the connection (True), or the deadline."""
    deadline_s = time.monotonic() + CLOSE_DEADLINE_S
    while time.monotonic() < deadline_s:
        try:
            conn.sendall(piece)
        except OSError:  # reset or broken pipe: closed
            return True
        if select.select([conn.sock], [], [], 0.05)[0]:
            try:
                if conn.sock.recv(65536) == b"":
                    return True
            except ConnectionResetError:
                return True
    return False


BAD_KEY = {"Authorization": "Bearer zg-wrong-key-0000", "Content-Type": "application/json"}
GOOD_KEY = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
REFUSED_BEFORE_THE_BODY = [  # path, headers, status, chunked
    ("/tokenize", BAD_KEY, 401, True),
    ("/detokenize", BAD_KEY, 401, True),
    ("/tokenize", {**GOOD_KEY, "Content-Length": str(64 * 2**20)}, 413, False),
    ("/admin/keys", {"Authorization": "Bearer admin-wrong-key-000"}, 401, True),
    ("/v1/chat/completions", BAD_KEY, 401, True),
    ("/health", {}, 405, True),
]


@pytest.mark.parametrize(("path", "headers", "status", "chunked"), REFUSED_BEFORE_THE_BODY)
def test_a_refusal_closes_its_connection_while_the_body_trickles(
    gateway: LimitedGateway, path: str, headers: dict[str, str], status: int, chunked: bool
) -> None:
    """The answer says `Connection: close`, and the connection closes while the client is still
    sending its body (with body_timeout_s an hour, nothing else would close it)."""
    with SourceConn(gateway.port, "127.0.0.31") as conn:
        if chunked:
            conn.sendall(chunked_head(path, headers) + b"100\r\n" + b"{" * 16)
        else:
            conn.sendall(request("POST", path, headers) + b"{" * 16)
        response = conn.read_response()
        assert response.status == status, response.body
        assert response.headers.get("connection") == "close"
        assert set(response.json()["error"]) == {"message", "type", "param", "code"}
        assert trickle_until_closed(conn, b" "), "the connection stayed open while the body trickled"


def test_a_body_that_comes_in_parts_keeps_the_connection(gateway: LimitedGateway, upstream: UpstreamServer) -> None:
    """The rule is for answers given before the body is read: a request whose body comes after its
    headers, and is read, is answered with keep-alive, and the connection serves the next one."""
    body = json.dumps({"model": "m", "prompt": "a b c"}).encode()
    with SourceConn(gateway.port, "127.0.0.32") as conn:
        for path in ("/tokenize", "/v1/completions"):
            raw = request("POST", path, GOOD_KEY, body)
            conn.sendall(raw[: -len(body)])  # the headers
            time.sleep(0.2)
            conn.sendall(raw[-len(body) :])
            response = conn.read_response()
            assert response.status == 200, response.body
            assert response.headers.get("connection") != "close"
        conn.sendall(HEALTH)
        assert conn.read_response().status == 200


# --- forwarded_allow_ips -------------------------------------------------------------------------

THROTTLE = "auth_failures_limit = 3\nauth_failure_window_s = 600"


def failed_auth(port: int, source: str, forwarded_for: str | None) -> int:
    headers = {"Authorization": "Bearer zg-guess-000000"}
    if forwarded_for is not None:
        headers["X-Forwarded-For"] = forwarded_for
    with SourceConn(port, source) as conn:
        conn.sendall(request("GET", "/v1/models", headers))
        return conn.read_response().status


def test_x_forwarded_for_is_ignored_by_default(tmp_path: Path, upstream: UpstreamServer) -> None:
    """From 127.0.0.1 (uvicorn's own default trusts it), with forwarded_allow_ips unset: the
    throttle counts the socket's address, whatever address each request claims."""
    config = limits_config(tmp_path, upstream.url, "", THROTTLE)
    assert config.server.forwarded_allow_ips == []
    with LimitedGateway(config) as gw:
        statuses = [failed_auth(gw.port, "127.0.0.1", f"198.51.100.{i}") for i in range(5)]
    assert statuses == [401, 401, 401, 429, 429]


def test_x_forwarded_for_is_honoured_from_a_trusted_proxy(tmp_path: Path, upstream: UpstreamServer) -> None:
    """forwarded_allow_ips = ["127.0.0.42"]: requests through it count against the address they
    name; the same header from another address is ignored."""
    config = limits_config(tmp_path, upstream.url, 'forwarded_allow_ips = ["127.0.0.42"]', THROTTLE)
    proxy, direct = "127.0.0.42", "127.0.0.43"
    with LimitedGateway(config) as gw:
        assert [failed_auth(gw.port, proxy, "198.51.100.1") for _ in range(4)] == [401, 401, 401, 429]
        assert failed_auth(gw.port, proxy, "198.51.100.2") == 401  # another client behind the proxy
        assert failed_auth(gw.port, proxy, None) == 401  # the proxy's own address is not blocked
        assert failed_auth(gw.port, direct, "198.51.100.1") == 401  # not trusted: counted as itself


def test_workers_ignore_x_forwarded_for_by_default(tmp_path: Path, upstream: UpstreamServer) -> None:
    """`zerogap gateway --workers 2`: each worker counts the socket's address (each its own count:
    an address is blocked in both after at most 2 x 3 failures)."""
    port = free_port()
    config = write_config(tmp_path / "config.toml", port, upstream.url, {"auth_failures_limit": 3})
    source = "127.0.0.1"  # uvicorn's own default trusts it
    with GatewayProcess(config, port, workers=2):
        statuses = []
        for i in range(60):  # until both workers refuse, 5 times in a row
            statuses.append(failed_auth(port, source, f"198.51.100.{i}"))
            if statuses[-5:] == [429] * 5:
                break
    assert statuses[-5:] == [429] * 5 and statuses.count(401) <= 6, statuses


def test_the_settings_are_checked() -> None:
    from common.config.gateway import ServerSection

    with pytest.raises(ValueError, match=r"max_connections_per_client \(300\) must be at most max_connections"):
        ServerSection(max_connections=200, max_connections_per_client=300)
    assert ServerSection(max_connections=100).max_connections_per_client == 100  # the default follows
    assert ServerSection().max_connections_per_client == 1024
    with pytest.raises(ValueError, match="idle_connection_timeout_s"):
        ServerSection(idle_connection_timeout_s=0)
    with pytest.raises(ValueError, match="not an IP address"):
        ServerSection(forwarded_allow_ips=["proxy.local"])
    assert ServerSection().forwarded_allow_ips == []
