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
