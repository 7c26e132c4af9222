"""The harness's TTFT counts from when the request's bytes go out (loadgen/send_clock.py), not from
before geventhttpclient's ~150 µs of head building; a new connection's connect stays inside."""

from __future__ import annotations

import itertools
import json
import time
from typing import Any

import pytest

from loadgen import send_clock
from loadgen.client import StreamClient
from loadgen.send_clock import SendClock
from tests.fixtures.upstream import Behavior, UpstreamServer

SLOW_HEAD_S = 0.5  # the client's own work before the send, made long: it must not count as TTFT


class _Pool:
    def __init__(self, sockets: list[object]) -> None:
        self.sockets = iter(sockets)

    def get_socket(self) -> object:
        return next(self.sockets)


class _Http:
    def __init__(self, sockets: list[object]) -> None:
        self._connection_pool = _Pool(sockets)


def test_a_kept_alive_socket_is_timed_after_the_hand_over_a_new_one_before_its_connect(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ticks = itertools.count(1)
    monkeypatch.setattr(send_clock.time, "perf_counter", lambda: float(next(ticks)))
    kept = object()
    http = _Http([kept, kept, object()])
    clock = SendClock(http)
    assert clock.hooked
    http._connection_pool.get_socket()  # new: read before the pool connects (tick 1)
    assert clock.sent_at == 1.0
    http._connection_pool.get_socket()  # the same socket again: read after the hand-over (ticks 2, 3)
    assert clock.sent_at == 3.0
    http._connection_pool.get_socket()  # a new connection: its connect counts (tick 4)
    assert clock.sent_at == 4.0
    clock.reset()
    assert clock.sent_at is None


def test_the_installed_geventhttpclient_still_has_the_pool_the_clock_reads() -> None:
    streamer = StreamClient("http://127.0.0.1:9", "/v1/chat/completions", {}, 1.0, 1.0)
    try:
        assert streamer.clock.hooked, (
            f"geventhttpclient's HTTPClient has no {send_clock.POOL_ATTRIBUTE}.get_socket any more: "
            "loadgen/send_clock.py times each request from before the head is built (see its docstring)"
        )
    finally:
        streamer.close()


def test_ttft_leaves_out_the_clients_own_work_before_the_send() -> None:
    """geventhttpclient's head building made slow (SLOW_HEAD_S): TTFT and E2E still count from the send,
    so both are under it (the upstream answers in 50 ms); timed from before the call, both are over it."""
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": True})
    with UpstreamServer(Behavior(ttft_s=0.05, interval_s=0.0)) as up:
        streamer = StreamClient(up.url, "/v1/chat/completions", {}, 5.0, 10.0)
        build = streamer.http._build_request

        def slow_build(*args: Any, **kwargs: Any) -> Any:
            time.sleep(SLOW_HEAD_S)
            return build(*args, **kwargs)

        streamer.http._build_request = slow_build  # type: ignore[method-assign]
        try:
            for _ in range(2):  # a new connection, then the kept one
                started = time.perf_counter()
                record, _walls, detail = streamer.stream(body.encode())
                took_s = time.perf_counter() - started
                assert record.ok, detail
                assert record.ttft_s is not None and 0.05 <= record.ttft_s < SLOW_HEAD_S, record
                assert record.e2e_s < SLOW_HEAD_S <= took_s, (record, took_s)
        finally:
            streamer.close()
