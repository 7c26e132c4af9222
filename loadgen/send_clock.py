"""When a request's bytes go to the socket: the moment TTFT, E2E and the sent time count from.

geventhttpclient's `HTTPClient.request` spends ~150 µs of Python on this machine before its
`sendall` (merging the headers case-insensitively, building the request line and head, and a
`select` that checks the kept-alive socket is still open). A clock read before the call counts
that as the server's time: the harness's TTFT over the sim's own was 0.13 ms further than
AIPerf's on the same Mooncake trace (issue 39, bench.dataset_peers). The clock is read when the
connection pool hands over the socket, the last step before the write, so only the client's own
work is left out:

- a kept-alive socket (the one this client used last): the clock after the hand-over;
- a new connection: the clock before it, so that the TCP connect (which a busy server's accept
  queue can hold) stays in the request's time, as a user sees it.

It relies on one private name of geventhttpclient (`HTTPClient._connection_pool`, whose
`get_socket` the request calls right before it writes). If a release changes that, the clock is
read before the call as it was before (`hooked` is False) and tests/loadtest/test_send_clock.py
fails, naming it.
"""

from __future__ import annotations

import time
from typing import Any

POOL_ATTRIBUTE = "_connection_pool"


class SendClock:
    """Wraps an HTTPClient's connection pool; `sent_at` is the last request's send (perf_counter)."""

    __slots__ = ("_get_socket", "_last_socket", "hooked", "sent_at")

    def __init__(self, http: Any) -> None:
        self._last_socket: Any = None
        self.sent_at: float | None = None
        pool = getattr(http, POOL_ATTRIBUTE, None)
        self._get_socket = getattr(pool, "get_socket", None)
        self.hooked = pool is not None and callable(self._get_socket)
        if self.hooked:
            pool.get_socket = self._hand_over  # type: ignore[union-attr]

    def _hand_over(self) -> Any:
        before = time.perf_counter()
        sock = self._get_socket()  # type: ignore[misc]
        self.sent_at = time.perf_counter() if sock is self._last_socket else before
        self._last_socket = sock
        return sock

    def reset(self) -> None:
        """Before a request: no send seen yet (a request that fails to connect keeps its own start)."""
        self.sent_at = None
