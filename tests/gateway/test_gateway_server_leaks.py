"""tests/gateway/helpers.py's in-process gateway leaves no connection open when it stops, even one
whose request it had to cancel at its graceful timeout (a client still sending the body): that
request's 500 closes lingering (gateway/server/lingering.py), which would outlive the server's event loop
and leave its transport open: a ResourceWarning in a later test (test_admin.py's, once)."""

from __future__ import annotations

import socket
import time
from pathlib import Path

from tests.fixtures.upstream import UpstreamServer
from tests.gateway.helpers import UNIFIED, GatewayServer, make_config


def test_a_request_cut_at_the_graceful_timeout_leaves_no_connection_open(tmp_path: Path) -> None:
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n"
        f"authorization: Bearer {UNIFIED}\r\ncontent-length: 100000\r\n\r\n"
    )
    with UpstreamServer(model="m") as up:
        gs = GatewayServer(make_config(tmp_path, [("b0", up.url, "m")]))
        with gs:
            client = socket.create_connection(("127.0.0.1", gs.config.server.port), timeout=30)
            client.sendall(head.encode() + b'{"model": "m", ')  # the rest of the body never comes
            deadline = time.monotonic() + 30
            while not gs.server.server_state.tasks:  # the app has the request, waiting for its body
                assert time.monotonic() < deadline, "the request never reached the app"
                time.sleep(0.01)
        try:  # the client is still connected and sending as the gateway stops
            assert not gs.thread.is_alive()
            left = list(gs.server.server_state.connections)
            assert not left, f"{len(left)} connection(s) still open after the gateway stopped"
        finally:
            client.close()
