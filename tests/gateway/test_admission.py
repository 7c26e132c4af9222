"""Admission on the headers, against a real gateway over real sockets: the key, its rpm and its
concurrency are decided before the body is read, so a refused request is answered while its
client is still sending; every refusal after admission gives its concurrency slot back."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from common.net import free_port
from gateway.tenants.keys.base import KeyLimits
from gateway.tenants.keys.sqlite import KeyStore
from tests.fixtures.upstream import UpstreamServer
from tests.gateway.helpers import METRICS_KEY, GatewayServer, auth, chat_body, error_of, get, make_config, metric, post
from tests.gateway.processes import GatewayProcess, write_config

BODY_BYTES = 4 * 1024 * 1024  # [gateway].max_body_bytes by default


def new_key(tmp_path: Path, name: str, **limits: int) -> str:
    store = KeyStore(tmp_path / "keys.db")
    try:
        return store.create(name, limits=KeyLimits(**limits))
    finally:
        store.close()


def head(key: str, length: int | None) -> bytes:
    framing = f"Content-Length: {length}" if length is not None else "Transfer-Encoding: chunked"
    return (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\n{framing}\r\n\r\n"
    ).encode()


def read_response_head(sock: socket.socket) -> tuple[int, dict[str, str]]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed before a response: {data!r}"
        data += chunk
    lines = data.split(b"\r\n\r\n")[0].decode().split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), {k.lower(): v for k, v in headers.items()}


def closed_by_server(sock: socket.socket) -> bool:
    """True once the server closed the connection (what it sent meanwhile is skipped)."""
    try:
        while sock.recv(65536):
            pass
    except ConnectionResetError:
        pass
    return True


@contextlib.contextmanager
def gateway(kind: str, tmp_path: Path, upstream_url: str) -> Iterator[str]:
    """The gateway's URL: in this process (plain httptools), or `zerogap gateway` as it is run
    (with its HTTP limits protocol)."""
    if kind == "thread":
        with GatewayServer(make_config(tmp_path, [("b0", upstream_url, "m")], per_key=True)) as gs:
            yield gs.url
        return
    port = free_port()
    server = f'metrics_key = "{METRICS_KEY}"'  # per-key series
    with GatewayProcess(write_config(tmp_path / "config.toml", port, upstream_url, {}, server), port) as proc:
        yield proc.url


@pytest.mark.parametrize("kind", ["thread", "process"])
async def test_a_refused_key_is_answered_before_its_body_is_sent(tmp_path: Path, kind: str) -> None:
    with UpstreamServer(model="m") as up, gateway(kind, tmp_path, up.url) as url:
        key = new_key(tmp_path, "busy", rpm=1)
        assert (await post(url + "/v1/chat/completions", chat_body(), auth(key)))[0] == 200  # rpm spent
        port = int(url.rsplit(":", 1)[1])
        status, headers = await asyncio.to_thread(_refused_mid_body, port, key, BODY_BYTES)
        assert status == 429 and headers.get("retry-after") and headers["connection"] == "close"
        status, headers = await asyncio.to_thread(_refused_chunked, port, key)
        assert status == 429 and headers["connection"] == "close"
        status, headers = await asyncio.to_thread(_refused_chunked, port, "zg-not-a-key-at-all-123")
        assert status == 401 and headers["connection"] == "close"
        _, text = await get(url + "/metrics", auth(METRICS_KEY))
    assert metric(text, "zerogap_ratelimited_total", key="busy", limit="rpm", model="none") == 2


def _refused_mid_body(port: int, key: str, length: int) -> tuple[int, dict[str, str]]:
    """A 4 MiB body: the 429 comes after its first KiB, with Connection: close; what the client
    still sends is read and dropped (lingering close: it can send its whole body, no reset), not
    buffered, and then the connection is closed."""
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        sock.sendall(head(key, length) + b"{" + b" " * 1023)
        status, headers = read_response_head(sock)
        sock.sendall(b" " * (length - 1024))
        assert closed_by_server(sock)
    return status, headers


def _refused_chunked(port: int, key: str) -> tuple[int, dict[str, str]]:
    """A chunked body of no stated length: answered at once, and the connection closed rather
    than drained to an end that may never come."""
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        sock.sendall(head(key, None) + b"400\r\n" + b" " * 1024 + b"\r\n")
        status, headers = read_response_head(sock)
        assert closed_by_server(sock)
    return status, headers


def _declared_too_large(port: int, key: str) -> tuple[int, dict[str, str]]:
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        sock.sendall(head(key, BODY_BYTES + 1) + b"{")
        status, headers = read_response_head(sock)
        assert closed_by_server(sock)
    return status, headers


async def test_every_refusal_after_admission_gives_the_slot_back(tmp_path: Path) -> None:
    with UpstreamServer(model="m") as up:
        config = make_config(tmp_path, [("b0", up.url, "m")])
        key = new_key(tmp_path, "single", max_concurrency=1, tpm=1000)
        url = config.server.base_url.rsplit("/api", 1)[0] + "/v1/chat/completions"
        with GatewayServer(config) as gs:
            refusals = [  # (body, status, the error's param)
                (chat_body(model="nope"), 404, "model"),
                ({"model": "m"}, None, "messages"),  # a 4xx naming the missing field
                ({**chat_body(), "messages": [{"role": "user", "content": "x " * 2500}]}, 400, "max_tokens"),  # > tpm
            ]
            for body, status, param in refusals:
                got, _, raw = await post(url, body, auth(key))
                assert got == status if status else 400 <= got < 500, raw
                assert error_of(raw)["param"] == param, raw
            assert error_of(raw)["code"] == "request_exceeds_tpm"
            await asyncio.to_thread(_gone_mid_body, config.server.port, key)
            status, _ = await asyncio.to_thread(_declared_too_large, config.server.port, key)
            assert status == 413
            assert await wait_until_free(gs)
            got, _, raw = await post(url, chat_body(max_tokens=10), auth(key))
            assert got == 200, raw


def _gone_mid_body(port: int, key: str) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        sock.sendall(head(key, 1000) + b"{")  # admitted on its headers; then the client leaves


async def wait_until_free(gs: GatewayServer) -> bool:
    limiter = gs.gw.limiter
    for _ in range(200):
        if limiter.num_held("single") == 0:  # type: ignore[attr-defined]
            return True
        await asyncio.sleep(0.05)
    return False
