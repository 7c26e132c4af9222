"""A gateway as `zerogap gateway` configures uvicorn (gateway.cli.uvicorn_config, uvloop), on a
thread, for the tests of the HTTP and connection limits; raw connections from any loopback
address (Linux routes all of 127/8 to lo), and the limits' answers and counts."""

from __future__ import annotations

import re
import socket
import threading
import time
from pathlib import Path

import uvicorn

from common.config import Config, parse_config
from common.net import free_port
from gateway.app import create_app
from gateway.cli import uvicorn_config
from tests.gateway.raw_http import Conn, parse, request

KEY = "unified-limits-secret-1"
SMALL_BUFFER_BYTES = 2048  # the kernel doubles it; autotuning is off for such a socket


class SourceConn(Conn):
    """A Conn from the loopback address `source` (127.0.0.2, ...: another client)."""

    def __init__(self, port: int, source: str, timeout_s: float = 20.0) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.settimeout(timeout_s)
        try:
            self.sock.bind((source, 0))
            self.sock.connect(("127.0.0.1", port))
        except OSError:
            self.sock.close()
            raise
        self.pending = b""


def eventually(predicate: object, timeout_s: float = 10.0) -> bool:
    assert callable(predicate)
    deadline = time.monotonic() + timeout_s
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.05)
    return bool(predicate())


def limits_config(tmp_path: Path, upstream_url: str, server: str, gateway: str = "") -> Config:
    """server, gateway: lines of [server] and [gateway]."""
    port = free_port()
    text = (
        f'[server]\nport = {port}\napi_key = "{KEY}"\n{server}\n'
        '[gateway]\nkey_store = "keys.db"\nhealth_interval_s = 0.2\nload_scrape_interval_s = 0.1\n'
        f"{gateway}\n"
        f'[[backends]]\nname = "b0"\nurl = "{upstream_url}"\nmodel = "m"\n'
    )
    return parse_config(text, str(tmp_path / "config.toml"), env={}, base_dir=tmp_path)


class LimitedGateway:
    """uvicorn as the gateway configures it, on a thread; its listening socket has a small receive
    buffer (inherited by each connection), so that a client's count of bytes sent is close to
    the bytes the server read."""

    def __init__(self, config: Config) -> None:
        self.port = config.server.port
        self.server = uvicorn.Server(uvicorn_config(create_app(config), config, "warning"))
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SMALL_BUFFER_BYTES)
        self.sock.bind(("127.0.0.1", self.port))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def num_connections(self) -> int:
        return len(self.server.server_state.connections)

    def __enter__(self) -> LimitedGateway:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "the gateway did not start"
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.sock.close()


def assert_error(raw: bytes, status: int, setting: str) -> None:
    response = parse(raw)
    assert response.status == status, raw[:300]
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and setting in error["message"], error
    assert response.headers["connection"] == "close"


def refused(gateway: LimitedGateway, reason: str, source: str = "127.0.0.1") -> float:
    """zerogap_http_refused_total{reason} as GET /metrics shows it (0 before the first), asked from
    `source`."""
    with SourceConn(gateway.port, source) as conn:
        conn.sendall(request("GET", "/metrics"))
        response = conn.read_response()
    assert response.status == 200, response
    found = re.search(rf'^zerogap_http_refused_total{{reason="{reason}"}} (\S+)$', response.body.decode(), re.M)
    return float(found.group(1)) if found else 0.0
