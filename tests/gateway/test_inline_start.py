"""A completion request goes upstream from the read that completed it: no task created and no
callback scheduled between its last body byte and the write of the request to the backend, and
that write happens before the client connection's data_received returns (gateway/server/inline_task.py,
gateway/server/http_limits.py). Events, not timing: the gateway's event loop is counted."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from gateway.server.http_limits import LimitedHttpProtocol
from gateway.upstream.connection import Connection
from tests.fixtures.upstream import Behavior, UpstreamServer
from tests.gateway.helpers import GatewayServer, auth, chat_body, events, make_config, post

GATEWAY_THREAD = "gateway"  # GatewayServer's thread: only its loop is counted


class LoopEvents:
    """Counts, on the gateway's thread, tasks created and callbacks scheduled with call_soon; notes
    the counts at each request's last body byte and at each request written upstream."""

    def __init__(self) -> None:
        self.tasks = 0
        self.soon = 0
        self.feeds = 0  # data_received calls of client connections, begun
        self.in_feed: int | None = None  # the data_received running now, if any
        self.body_ends: list[tuple[int, int, int | None, str]] = []  # (tasks, soon, feed, path) at a message's end
        self.writes: list[tuple[int, int, int | None]] = []  # (tasks, soon, feed) at an upstream write

    @staticmethod
    def mine() -> bool:
        return threading.current_thread().name == GATEWAY_THREAD


class RecordingTransport:
    """A backend connection's transport that notes its writes."""

    def __init__(self, transport: Any, seen: LoopEvents) -> None:
        self._transport = transport
        self._seen = seen

    def write(self, data: bytes) -> None:
        seen = self._seen
        seen.writes.append((seen.tasks, seen.soon, seen.in_feed))
        self._transport.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


@pytest.fixture
def seen(monkeypatch: pytest.MonkeyPatch) -> Iterator[LoopEvents]:
    seen = LoopEvents()
    loop_class = asyncio.BaseEventLoop
    create_task, call_soon = loop_class.create_task, loop_class.call_soon

    def counted_create_task(self: Any, *args: Any, **kwargs: Any) -> Any:
        if seen.mine():
            seen.tasks += 1
        return create_task(self, *args, **kwargs)

    def counted_call_soon(self: Any, *args: Any, **kwargs: Any) -> Any:
        if seen.mine():
            seen.soon += 1
        return call_soon(self, *args, **kwargs)

    data_received = LimitedHttpProtocol.data_received
    on_message_complete = LimitedHttpProtocol.on_message_complete
    connection_made = Connection.connection_made

    def noted_data_received(self: Any, data: bytes) -> None:
        seen.feeds += 1
        outer, seen.in_feed = seen.in_feed, seen.feeds
        try:
            data_received(self, data)
        finally:
            seen.in_feed = outer

    def noted_message_complete(self: Any) -> None:
        seen.body_ends.append((seen.tasks, seen.soon, seen.in_feed, self.scope.get("path", "")))
        on_message_complete(self)

    def recorded_connection_made(self: Any, transport: Any) -> None:
        connection_made(self, RecordingTransport(transport, seen))  # type: ignore[arg-type]

    monkeypatch.setattr(loop_class, "create_task", counted_create_task)
    monkeypatch.setattr(loop_class, "call_soon", counted_call_soon)
    monkeypatch.setattr(LimitedHttpProtocol, "data_received", noted_data_received)
    monkeypatch.setattr(LimitedHttpProtocol, "on_message_complete", noted_message_complete)
    monkeypatch.setattr(Connection, "connection_made", recorded_connection_made)
    yield seen


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/api/v1/chat/completions", "/v1/completions"])
async def test_a_completion_goes_upstream_from_the_read_that_completed_it(
    tmp_path: Any, seen: LoopEvents, path: str
) -> None:
    body = chat_body() if "chat" in path else {"model": "m", "prompt": "say hello", "stream": True}
    with UpstreamServer(Behavior(num_output_tokens=3), model="m") as up:
        with GatewayServer(make_config(tmp_path, [("b0", up.url, "m")])) as gs:  # base_url's path: /api
            for _ in range(3):  # the first opens the backend connection (a wait); the others reuse it
                status, _, raw = await post(gs.url + path, body, auth())
                assert status == 200 and events(raw)[-1] == "[DONE]"
    ends = [e for e in seen.body_ends if e[3] == path]
    assert len(ends) == 3
    later = [w for w in seen.writes if w[2] is not None]  # writes made inside a client read
    assert len(later) >= 2, (
        f"the requests on a pooled backend connection were written from no client read: {seen.writes}"
    )
    for tasks, soon, feed, _ in ends[1:]:
        write = next((w for w in seen.writes if w[2] == feed), None)
        assert write is not None, f"the request whose body ended in read {feed} was not written upstream in that read"
        assert write[0] - tasks == 0, f"{write[0] - tasks} task(s) created between the last body byte and the write"
        assert write[1] - soon == 0, f"{write[1] - soon} callback(s) scheduled between the last body byte and the write"


async def test_other_paths_still_run_as_tasks(tmp_path: Any, seen: LoopEvents) -> None:
    """The control: the event counts see uvicorn's task for a request that is not a completion."""
    with UpstreamServer(Behavior(num_output_tokens=1), model="m") as up:
        with GatewayServer(make_config(tmp_path, [("b0", up.url, "m")])) as gs:
            tasks_before = seen.tasks
            status, _, _ = await post(gs.url + "/v1/models", {}, auth())  # POST: 405, from a task
    assert status == 405
    assert seen.tasks > tasks_before
