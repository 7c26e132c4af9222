"""gateway/relay/client_side.py on its own: the paths the served tests (test_proxy, test_usage_charged,
test_cycles) do not reach: a client gone before the hook, the hook after the request, and the
task a server other than uvicorn's httptools gets."""

from __future__ import annotations

import asyncio
import gc
import logging
import time
import weakref
from types import SimpleNamespace
from typing import Any

from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from gateway.relay.client_side import KEEPALIVE, ClientSide
from gateway.relay.exchange import SSE_HEADERS


class FakeExchange:
    """What ClientSide reads of an Exchange."""

    def __init__(self, stream: bool) -> None:
        self.call = SimpleNamespace(stream=stream)
        self.t0_s = time.monotonic()
        self.replied = False
        self.started = False

    def start_stream(self) -> bool:
        started, self.started = self.started, True
        return not started

    def stream_headers(self, answer_s: float | None = None) -> list[tuple[bytes, bytes]]:
        return SSE_HEADERS


class Recorder:
    """A `send` that keeps what it was given; `three` is set at the third message."""

    def __init__(self) -> None:
        self.sent: list[Any] = []
        self.three = asyncio.Event()

    async def __call__(self, message: Any) -> None:
        self.sent.append(message)
        if len(self.sent) >= 3:
            self.three.set()


class Transport:
    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def uvicorn_cycle() -> RequestResponseCycle:
    log = logging.getLogger("test")
    scope: Any = {"type": "http", "method": "POST"}
    transport: Any = Transport()
    return RequestResponseCycle(
        scope, transport, FlowControl(transport), log, log, False, [], asyncio.Event(), False, True, lambda: None
    )


def receive_of(cycle: RequestResponseCycle) -> Any:
    return cycle.receive


def lost(cycle: RequestResponseCycle) -> None:
    """What uvicorn's connection_lost does to the cycle of a request in flight."""
    cycle.disconnected = True
    cycle.message_event.set()


async def relay_task() -> asyncio.Task[None]:
    task = asyncio.ensure_future(asyncio.sleep(60))
    await asyncio.sleep(0)
    return task


async def no_send(message: Any) -> None:
    raise AssertionError(f"nothing is sent here: {message}")


async def test_a_client_gone_on_uvicorn_cancels_the_relay_from_the_callback() -> None:
    cycle, task = uvicorn_cycle(), await relay_task()
    client = ClientSide(FakeExchange(stream=False), no_send, 10.0)  # type: ignore[arg-type]
    client.start(receive_of(cycle), task)
    assert not task.cancelled()
    lost(cycle)  # no task of the client side's runs in between: the callback cancels
    await asyncio.sleep(0)
    assert task.cancelled() and client.gone
    client.stop()


async def test_a_client_gone_before_the_hook_cancels_the_relay_at_once() -> None:
    cycle, task = uvicorn_cycle(), await relay_task()
    lost(cycle)
    client = ClientSide(FakeExchange(stream=True), no_send, 0.01)  # type: ignore[arg-type]
    client.start(receive_of(cycle), task)
    await asyncio.sleep(0.05)  # no keep-alive either (no_send would fail)
    assert task.cancelled() and client.gone
    client.stop()


async def test_after_stop_a_disconnect_stops_nothing_and_the_cycle_is_freed_by_reference_counting() -> None:
    cycle, task = uvicorn_cycle(), await relay_task()
    client = ClientSide(FakeExchange(stream=True), no_send, 10.0)  # type: ignore[arg-type]
    client.start(receive_of(cycle), task)
    client.stop()
    lost(cycle)
    await asyncio.sleep(0)
    assert not task.cancelled() and not client.gone
    task.cancel()
    ref = weakref.ref(cycle)
    gc.disable()
    try:
        del cycle, client
        assert ref() is None, "the cycle outlived its request: a reference cycle through its message event"
    finally:
        gc.enable()


async def test_on_another_server_a_task_reads_receive_for_the_disconnect_and_sends_keepalives() -> None:
    disconnect = asyncio.Event()

    async def receive() -> dict[str, Any]:
        await disconnect.wait()
        return {"type": "http.disconnect"}

    task, send = await relay_task(), Recorder()
    client = ClientSide(FakeExchange(stream=True), send, 0.01)  # type: ignore[arg-type]
    client.start(receive, task)
    await send.three.wait()  # the head, then a comment every 10 ms while no answer came
    sent = send.sent
    assert sent[0]["type"] == "http.response.start"
    assert sent[1] == sent[2] == {"type": "http.response.body", "body": KEEPALIVE, "more_body": True}
    assert not task.cancelled()
    disconnect.set()
    await asyncio.sleep(0.01)
    assert task.cancelled() and client.gone
    client.stop()


async def test_keepalives_on_uvicorn_come_from_a_timer_until_the_answer() -> None:
    cycle, task, send = uvicorn_cycle(), await relay_task(), Recorder()
    exchange = FakeExchange(stream=True)
    client = ClientSide(exchange, send, 0.01)  # type: ignore[arg-type]
    client.start(receive_of(cycle), task)
    await send.three.wait()
    sent = send.sent
    assert sent[0]["type"] == "http.response.start" and sent[1]["body"] == sent[2]["body"] == KEEPALIVE
    exchange.replied = True  # the answer's first bytes went out: no more comments
    await asyncio.sleep(0.03)
    num_sent = len(sent)
    await asyncio.sleep(0.05)
    assert len(sent) == num_sent
    client.stop()
    task.cancel()


async def test_a_keepalive_that_fails_is_logged_not_left_unretrieved(caplog) -> None:
    cycle, task = uvicorn_cycle(), await relay_task()
    failed = asyncio.Event()

    async def send(message: Any) -> None:
        failed.set()
        raise OSError("socket gone")

    client = ClientSide(FakeExchange(stream=True), send, 0.01)  # type: ignore[arg-type]
    client.start(receive_of(cycle), task)
    await failed.wait()
    await asyncio.sleep(0)  # the done callback
    assert "keep-alive comment could not be sent" in caplog.text and "socket gone" in caplog.text
    client.stop()
    task.cancel()
