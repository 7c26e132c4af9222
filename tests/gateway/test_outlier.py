"""The outlier rule on its own: failures in a row, the doubling ejection time, the reset."""

from __future__ import annotations

import types

import pytest

import gateway.outlier
from gateway.outlier import OutlierDetector
from gateway.pool import Backend, Router
from zerogap.config.gateway import BackendEntry, GatewaySection


def detector(monkeypatch: pytest.MonkeyPatch, now_s: list[float]) -> tuple[OutlierDetector, list[Backend], list[str]]:
    monkeypatch.setattr(gateway.outlier, "time", types.SimpleNamespace(monotonic=lambda: now_s[0]))
    settings = GatewaySection()
    entries = [BackendEntry(name=n, url=f"http://127.0.0.1:{i + 1}", model="m") for i, n in enumerate("ab")]
    router = Router(entries, settings.routing, settings.cache_aware)
    taken: list[str] = []

    def take_out(backend: Backend, reason: str) -> None:
        backend.healthy = False
        taken.append(reason)

    return OutlierDetector(router, settings, take_out), router.backends, taken


def test_ejection_time_doubles_up_to_the_cap(monkeypatch) -> None:
    det, _, _ = detector(monkeypatch, [0.0])
    assert [det.ejection_s(n) for n in range(1, 8)] == [30, 60, 120, 240, 300, 300, 300]


def test_failures_in_a_row_eject_and_a_good_spell_starts_over(monkeypatch) -> None:
    now_s = [1000.0]
    det, (a, _), taken = detector(monkeypatch, now_s)
    det.failure(a, "503")
    det.failure(a, "503")
    det.success(a)  # not in a row any more
    det.failure(a, "503")
    det.failure(a, "connect")
    assert a.healthy and not taken
    det.failure(a, "broken")
    assert not a.healthy and det.held_s(a) == 30 and "last: broken" in taken[0]
    now_s[0] += 31
    a.healthy = True  # its health check passed
    for _ in range(3):
        det.failure(a, "500")
    assert det.held_s(a) == 60  # soon again: doubled
    now_s[0] += 60 + 301  # then back, and good for longer than the longest ejection
    a.healthy = True
    for _ in range(3):
        det.failure(a, "500")
    assert det.held_s(a) == 30


def test_a_5xx_counts_once_another_backend_served_the_request(monkeypatch) -> None:
    det, (a, b), taken = detector(monkeypatch, [1000.0])
    for _ in range(5):  # the request got 500 from a and from b: neither counts
        failures = det.for_request()
        failures.failed(a, "500")
        failures.failed(b, "500")
        failures.unserved(2)
    assert a.healthy and b.healthy and not taken
    for _ in range(2):  # a alone could be tried: its 500 counts
        failures = det.for_request()
        failures.failed(a, "503")
        failures.unserved(1)
    failures = det.for_request()
    failures.failed(a, "500")
    assert a.healthy  # not yet: the request is still out
    failures.served()  # b served it: the third in a row
    assert not a.healthy and "last: 500" in taken[0]
    a.healthy = True  # its health check passed
    connect = det.for_request()
    for _ in range(3):
        connect.failed(b, "connect")  # a connect error counts at once, whatever the request's outcome
    assert not b.healthy and "last: connect" in taken[1]


def test_a_run_is_judged_in_the_order_its_events_happened(monkeypatch) -> None:
    det, (a, _), taken = detector(monkeypatch, [1000.0])
    held = [det.failure(a, "503", pending=True) for _ in range(3)]  # three 5xx, their requests still out
    for _ in range(3):
        det.success(a)  # then successes: they came after the run
    for event in held[:2]:
        assert event is not None
        det.settle(a, event, counts=True)
    assert a.healthy
    assert held[2] is not None
    det.settle(a, held[2], counts=True)  # the third is confirmed: three in a row, before the successes
    assert not a.healthy and "last: 503" in taken[0]


def test_a_pardoned_5xx_leaves_the_run_around_it(monkeypatch) -> None:
    det, (a, _), taken = detector(monkeypatch, [1000.0])
    det.failure(a, "connect")
    pardoned = det.failure(a, "500", pending=True)
    det.failure(a, "broken")
    assert pardoned is not None
    det.settle(a, pardoned, counts=False)  # its request failed everywhere: not a's fault
    assert a.healthy and not taken
    det.failure(a, "connect")  # connect, broken, connect: three in a row
    assert not a.healthy and "last: connect" in taken[0]
