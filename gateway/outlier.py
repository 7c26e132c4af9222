"""Passive outlier detection: a backend whose requests fail N times in a row leaves the pool at
once, without waiting for the next health check.

Failures are connect errors, connections reset (before or during a stream) and 5xx answers.
Each counts when it happens, and so do successes, so that one kind of event cannot always win
the race to the count: a 200 counts when its headers come (as a 5xx does; not at the first
token, which can take seconds), and a stream that ends well counts again when it ends (as a
break does). Otherwise, when least load sends every new request to a backend back from an
ejection, the other hears only the breaks of its streams in flight and leaves at once.

A 5xx answer takes its place in the backend's history when it comes, but counts only once its
request is served by another backend (or could be tried nowhere else); if the request gets a 5xx
from every backend it tries, the answer says nothing about any one of them and leaves the
history. (Otherwise one client with a prompt that crashes the engine could eject a model's
backends one after another, three requests each.) A run is judged in the order its events
happened, when its last 5xx is settled.

An ejected backend stays out for a base time that doubles on each repeat (30, 60, 120, 240,
300 s by default) and comes back at the first health check that passes after it. A backend that
has stayed in the pool for the longest ejection time starts again from the base time. The last
healthy backend of a model is never ejected (a failing backend still beats a 503 for everyone).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable

from gateway.pool import Backend, Router
from zerogap.config.gateway import GatewaySection

log = logging.getLogger("zerogap.gateway.outlier")


HISTORY = 64  # events kept per backend while some 5xx wait for their request's outcome


class _Event:
    __slots__ = ("ok", "pending", "what")

    def __init__(self, ok: bool, what: str, pending: bool) -> None:
        self.ok = ok
        self.what = what
        self.pending = pending  # a 5xx whose request is still out (it counts once confirmed)


class _Record:
    __slots__ = ("events", "num_ejections", "num_pending", "until_s")

    def __init__(self) -> None:
        self.events: deque[_Event] = deque()  # in the order they happened, since the last resolved run
        self.num_pending = 0
        self.num_ejections = 0
        self.until_s = 0.0  # monotonic time before which it stays out

    def clear(self) -> None:
        for event in self.events:
            event.pending = False  # its confirmation or pardon comes to nothing
        self.events.clear()
        self.num_pending = 0


class OutlierDetector:
    def __init__(self, router: Router, settings: GatewaySection, take_out: Callable[[Backend, str], None]) -> None:
        self.router = router
        self.num_errors_to_eject = settings.outlier_consecutive_errors
        self.base_s = settings.outlier_base_ejection_s
        self.max_s = settings.outlier_max_ejection_s
        self.take_out = take_out
        self._records = {b: _Record() for b in router.backends}

    def success(self, backend: Backend) -> None:
        record = self._records[backend]
        if record.num_pending:  # a run before it may still be completed by a confirmation
            self._add(record, _Event(True, "", False))
        elif record.events:
            record.events.clear()  # every run before it is settled

    def failure(self, backend: Backend, what: str, pending: bool = False) -> _Event | None:
        """A failure now; `pending`: it counts only once confirmed (None: not counted at all)."""
        if not self.num_errors_to_eject or not backend.healthy:
            return None
        record = self._records[backend]
        event = _Event(False, what, pending)
        self._add(record, event)
        record.num_pending += pending
        if not pending:
            self._check(backend, record)
        return event

    def settle(self, backend: Backend, event: _Event, counts: bool) -> None:
        """A pending failure's request was served elsewhere (counts) or failed everywhere (it does not)."""
        if not event.pending:
            return  # its history was cleared meanwhile
        record = self._records[backend]
        event.pending = False
        record.num_pending -= 1
        if not counts:
            record.events.remove(event)
        self._check(backend, record)

    def _add(self, record: _Record, event: _Event) -> None:
        if len(record.events) >= HISTORY:
            oldest = record.events.popleft()
            if oldest.pending:
                oldest.pending = False
                record.num_pending -= 1
        record.events.append(event)

    def _check(self, backend: Backend, record: _Record) -> None:
        """Eject when the history holds N counted failures in a row."""
        run = 0
        for event in record.events:
            run = 0 if event.ok or event.pending else run + 1
            if run >= self.num_errors_to_eject:
                break
        else:
            return
        record.clear()
        if not backend.healthy:
            return
        if not self.router.pools[backend.model].any_healthy(besides=backend):
            log.warning("backend %s failed %d times in a row but is the last healthy one of model %s: kept",
                        backend.name, run, backend.model)  # fmt: skip
            return
        now = time.monotonic()
        if now - record.until_s > self.max_s:  # it behaved for a long time: start from the base again
            record.num_ejections = 0
        record.num_ejections += 1
        eject_s = self.ejection_s(record.num_ejections)
        record.until_s = now + eject_s
        self.take_out(
            backend, f"{self.num_errors_to_eject} failures in a row (last: {event.what}); out for {eject_s:g} s"
        )

    def for_request(self) -> RequestFailures:
        return RequestFailures(self)

    def ejection_s(self, num_ejections: int) -> float:
        """How long the num_ejections-th ejection in a row lasts."""
        return float(min(self.max_s, self.base_s * 2 ** min(num_ejections - 1, 32)))

    def held_s(self, backend: Backend) -> float:
        """Seconds it still stays out whatever its health check says (0: free to return)."""
        return max(0.0, self._records[backend].until_s - time.monotonic())


class RequestFailures:
    """One request's failures before its first byte: a connect error or reset counts at once; a
    5xx answer is held in its backend's history until the request's outcome settles it."""

    __slots__ = ("_answers", "detector")

    def __init__(self, detector: OutlierDetector) -> None:
        self.detector = detector
        self._answers: list[tuple[Backend, _Event]] = []

    def failed(self, backend: Backend, what: str) -> None:
        if not what.isdigit():
            self.detector.failure(backend, what)
            return
        event = self.detector.failure(backend, what, pending=True)
        if event is not None:
            self._answers.append((backend, event))

    def served(self) -> None:
        """Another backend answered it: the 5xx answers before count."""
        self._settle(True)

    def unserved(self, num_tried: int) -> None:
        """Every attempt failed: 5xx answers from several backends do not count; one alone does."""
        self._settle(num_tried == 1)

    def _settle(self, counts: bool) -> None:
        for backend, event in self._answers:
            self.detector.settle(backend, event, counts)
        self._answers.clear()
