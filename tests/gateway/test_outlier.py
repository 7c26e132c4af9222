"""The outlier rules on their own: the fast path (failures in a row), the rates judged every
interval against the backend's peers, max_ejection_percent, the doubling ejection time."""

from __future__ import annotations

import types
from typing import Any

import pytest

import gateway.pool.outlier
from common.config.gateway import BackendEntry, GatewaySection
from gateway.pool.model_pool import Backend, Router
from gateway.pool.outlier import OutlierDetector

INTERVAL_S = GatewaySection().outlier_interval_s


def detector(
    monkeypatch: pytest.MonkeyPatch, now_s: list[float], names: str = "ab", **settings: Any
) -> tuple[OutlierDetector, list[Backend], list[str]]:
    monkeypatch.setattr(gateway.pool.outlier, "time", types.SimpleNamespace(monotonic=lambda: now_s[0]))
    section = GatewaySection(**settings)
    entries = [BackendEntry(name=n, url=f"http://127.0.0.1:{i + 1}", model="m") for i, n in enumerate(names)]
    router = Router(entries, section.routing, section.cache_aware)
    taken: list[str] = []

    def take_out(backend: Backend, reason: str) -> None:
        backend.healthy = False
        taken.append(f"{backend.name}: {reason}")

    return OutlierDetector(router, section, take_out), router.backends, taken


def requests(det: OutlierDetector, backend: Backend, num: int, num_failed: int, what: str = "500") -> None:
    """num requests ended at backend, num_failed of them spread evenly: each 5xx served by another
    backend; "broken": a stream that broke after its 200. The attempts are counted as
    Flights.close counts them."""
    for i in range(num):
        if i * num_failed // num != (i + 1) * num_failed // num and what == "broken":
            det.success(backend)
            det.failure(backend, "broken")
        elif i * num_failed // num != (i + 1) * num_failed // num:
            failures = det.for_request()
            failures.failed(backend, what)
            failures.served()
        else:
            det.success(backend)
        backend.num_attempts += 1


def test_ejection_time_doubles_up_to_the_cap(monkeypatch) -> None:
    det, _, _ = detector(monkeypatch, [0.0])
    assert [det.ejection_s(n) for n in range(1, 8)] == [30, 60, 120, 240, 300, 300, 300]


def test_five_failures_in_a_row_eject_at_once_and_a_success_starts_over(monkeypatch) -> None:
    now_s = [1000.0]
    det, (a, _), taken = detector(monkeypatch, now_s)
    for _ in range(4):
        det.for_request().failed(a, "connect")
    det.success(a)  # not in a row any more
    for _ in range(4):
        det.for_request().failed(a, "broken")  # closed before an answer
    assert a.healthy and not taken
    det.for_request().failed(a, "connect")
    assert not a.healthy and det.held_s(a) == 30
    assert "5 failures in a row" in taken[0] and "last: connect" in taken[0]
    now_s[0] += 31
    a.healthy = True  # its health check passed
    for _ in range(5):
        det.failure(a, "500")
    assert det.held_s(a) == 60  # soon again: doubled
    now_s[0] += 60 + 301  # then back, and good for longer than the longest ejection
    a.healthy = True
    for _ in range(5):
        det.failure(a, "500")
    assert det.held_s(a) == 30


def test_broken_streams_count_in_the_rates_only(monkeypatch) -> None:
    """A stream that breaks after its 200 (the noise of a real engine) never makes a run."""
    det, (a, _), taken = detector(monkeypatch, [1000.0])
    for _ in range(20):
        det.failure(a, "broken")
    assert a.healthy and not taken


def test_a_5xx_counts_once_another_backend_served_the_request(monkeypatch) -> None:
    det, (a, b), taken = detector(monkeypatch, [1000.0])
    for _ in range(8):  # the request got 500 from a and from b: neither counts
        failures = det.for_request()
        failures.failed(a, "500")
        failures.failed(b, "500")
        failures.unserved(2)
    assert a.healthy and b.healthy and not taken
    for _ in range(4):  # a alone could be tried: its 500 counts
        failures = det.for_request()
        failures.failed(a, "503")
        failures.unserved(1)
    failures = det.for_request()
    failures.failed(a, "500")
    assert a.healthy  # not yet: the request is still out
    failures.served()  # b served it: the fifth in a row
    assert not a.healthy and "last: 500" in taken[0]


def test_a_run_is_judged_in_the_order_its_events_happened(monkeypatch) -> None:
    det, (a, _), taken = detector(monkeypatch, [1000.0])
    held = [det.failure(a, "503", pending=True) for _ in range(5)]  # five 5xx, their requests still out
    for _ in range(3):
        det.success(a)  # then successes: they came after the run
    for event in held[:4]:
        assert event is not None
        det.settle(a, event, counts=True)
    assert a.healthy
    assert held[4] is not None
    det.settle(a, held[4], counts=True)  # the fifth is confirmed: five in a row, before the successes
    assert not a.healthy and "last: 503" in taken[0]


def test_a_pending_5xx_that_never_settles_is_dropped_and_counted(monkeypatch) -> None:
    det, (a, _), _ = detector(monkeypatch, [1000.0])
    dropped: list[int] = []
    det.on_dropped = lambda backend, num: dropped.append(num)
    det.for_request().failed(a, "500")  # its client left during the retry: never settled
    for _ in range(gateway.pool.outlier.HISTORY - 1):
        det.success(a)  # kept behind it, in case it completes a run
    assert not dropped
    det.success(a)
    assert dropped == [1] and a.healthy


def test_a_sick_backend_is_ejected_when_its_interval_ends(monkeypatch) -> None:
    now_s = [1000.0]
    det, (a, b, c), taken = detector(monkeypatch, now_s, "abc")
    for backend, num_failed in ((a, 20), (b, 2), (c, 3)):  # 40 % against 4 % and 6 %
        requests(det, backend, 50, num_failed)
    assert not taken  # within the interval: nothing judged yet
    now_s[0] += INTERVAL_S
    det.success(b)  # the first event after it
    assert [t.split(":")[0] for t in taken] == ["a"]
    assert "success rate 60.0% (20 of 50 failed) below its peers' 95.0%" in taken[0], taken
    assert f"in the last {INTERVAL_S:g} s" in taken[0]


def test_a_failure_that_hits_every_backend_ejects_none(monkeypatch) -> None:
    """Each backend is judged against its peers: a bad prompt or a client's disconnects that
    fail 40 % (or 80 %, above the absolute threshold) everywhere eject nothing."""
    now_s = [1000.0]
    det, backends, taken = detector(monkeypatch, now_s, "abc")
    for share in (0.4, 0.8):
        for backend, extra in zip(backends, (0, 2, 4), strict=True):
            requests(det, backend, 50, int(50 * share) + extra, "broken")
        now_s[0] += INTERVAL_S
        det.judge("m")
        assert all(b.healthy for b in backends) and not taken


def test_below_min_requests_nothing_is_judged(monkeypatch) -> None:
    now_s = [1000.0]
    det, (a, b, c), taken = detector(monkeypatch, now_s, "abc")
    requests(det, a, 19, 10)  # one request short of outlier_min_requests (20)
    requests(det, b, 50, 0)
    requests(det, c, 50, 0)
    now_s[0] += INTERVAL_S
    det.judge("m")
    assert a.healthy and not taken


def test_the_failure_percentage_judges_a_backend_without_peers_to_compare(monkeypatch) -> None:
    """Only a has enough requests: 40 % is no verdict without peers; 50 % (the threshold) is."""
    now_s = [1000.0]
    det, (a, b), taken = detector(monkeypatch, now_s)
    for num_failed in (12, 15):
        requests(det, a, 30, num_failed)
        requests(det, b, 5, 0)
        now_s[0] += INTERVAL_S
        det.judge("m")
    assert len(taken) == 1 and "failure share 50.0% (15 of 30)" in taken[0] and "its peers': 0.0%" in taken[0]


def test_pardoned_5xx_leave_the_counts(monkeypatch) -> None:
    """a's 500s came with requests that failed everywhere: neither failures nor requests of a."""
    now_s = [1000.0]
    det, (a, b, c), taken = detector(monkeypatch, now_s, "abc")
    for _ in range(40):
        failures = det.for_request()
        failures.failed(a, "500")
        failures.failed(b, "500")
        failures.unserved(2)
        a.num_attempts += 1
        b.num_attempts += 1
    requests(det, a, 30, 1)
    requests(det, b, 30, 1)
    requests(det, c, 30, 1)
    now_s[0] += INTERVAL_S
    det.judge("m")
    assert not taken


@pytest.mark.parametrize(("names", "num_sick", "num_ejected"), [("abcd", 3, 2), ("abc", 2, 1), ("ab", 1, 1)])
def test_max_ejection_percent(monkeypatch, names: str, num_sick: int, num_ejected: int) -> None:
    """At most 50 % of a model's backends out by these rules at once (at least one)."""
    now_s = [1000.0]
    det, backends, taken = detector(monkeypatch, now_s, names)
    for i, backend in enumerate(backends):
        requests(det, backend, 100, 90 if i < num_sick else 1)
    now_s[0] += INTERVAL_S
    det.judge("m")
    assert sum(not b.healthy for b in backends) == num_ejected, taken
    backends[0].healthy = True  # back from its ejection: the next sick one may go
    for i, backend in enumerate(backends):
        requests(det, backend, 100, 90 if 0 < i < num_sick else 1)
    now_s[0] += INTERVAL_S
    det.judge("m")
    assert len(taken) == min(num_sick, num_ejected + 1), taken


def test_the_last_healthy_backend_is_never_ejected(monkeypatch) -> None:
    now_s = [1000.0]
    det, (a, b), taken = detector(monkeypatch, now_s)
    b.healthy = False  # out by its health check
    for _ in range(10):
        det.for_request().failed(a, "connect")
    requests(det, a, 50, 40)
    now_s[0] += INTERVAL_S
    det.judge("m")
    assert a.healthy and not taken
