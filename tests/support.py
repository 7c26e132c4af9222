"""Plain helpers for tests (fixtures live in conftest.py; nothing is imported from there)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from common.commands import zerogap_command

REPO = Path(__file__).resolve().parent.parent


def zerogap_cmd(*args: str) -> list[str]:
    """Run the console script through this interpreter (works without PATH set up)."""
    return zerogap_command(*args)


def wait_until(predicate: Callable[[], object], what: str, timeout_s: float) -> None:
    """Polls predicate every 0.1 s until it is true; fails the test after timeout_s, naming what it waited for."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s:g} s"
        time.sleep(0.1)


class QuietHandler(BaseHTTPRequestHandler):
    """A stand-in server's handler: answers with reply(), logs nothing."""

    def reply(self, status: int, body: bytes, content_type: str | None = None) -> None:
        self.send_response(status)
        if content_type is not None:
            self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def serving(handler: Callable[..., BaseHTTPRequestHandler]) -> Iterator[str]:
    """`handler` (a handler class, or a partial of one) served on a free loopback port from a thread;
    yields the base URL; shut down at the end."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
