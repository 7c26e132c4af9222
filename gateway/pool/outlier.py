"""Passive outlier detection, as Envoy's: a backend whose requests fail more than its peers' leaves
the pool without waiting for a health check.

Real engines are noisy (some requests fail, some streams break), so a backend's failures are
judged by their rate against its peers', every `outlier_interval_s` per model (the rules:
`outlier_rates.py`). A fast path stays for a backend that fails everything:
`outlier_consecutive_errors` (5) failures in a row eject it at once (Envoy's consecutive_5xx):
connect errors, connections closed before an answer, and 5xx answers; a success (a 200's headers,
a stream's clean end) breaks the run. A stream that breaks after its 200 counts in the rates only.
Noise does not reach 5 in a row: at 4 % of 500s, once in about 10 million requests (3 in a row:
once in 16,000); a backend failing 40 % of its requests gets there within about 160.

What the rates count, per backend and interval: its attempts that ended (`Backend.num_attempts`,
counted by `Flights.close`) and its failures (as above, and broken streams). A 5xx counts only once
its request is served by another backend (or could be tried nowhere else); if the request gets a
5xx from every backend it tries, the answer says nothing about any one of them and leaves both
counts (one client with a prompt that crashes the engine ejects nothing). A 5xx takes its place in
the backend's history of the run when it comes, and the run is judged in the order its events
happened, when its last 5xx is settled. A 5xx whose request never settles (the client left during
its retry) leaves the history uncounted once 64 newer events push it out (`on_dropped`: the metric).

An ejected backend stays out for a base time that doubles on each repeat (30, 60, 120, 240,
300 s by default) and comes back at the health check that passes after it. A backend that has
stayed in the pool for the longest ejection time starts again from the base time. These rules
never eject more than `max_ejection_percent` of a model's backends (at least one), and never the
last healthy one (a failing backend still beats a 503 for everyone).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable

from common.config.gateway import GatewaySection
from gateway.pool.model_pool import Backend, Router
from gateway.pool.outlier_rates import Tally, verdict

log = logging.getLogger("zerogap.gateway.outlier")

HISTORY = 64  # events of the run kept per backend while some 5xx wait for their request's outcome


class _Event:
    __slots__ = ("ok", "pending", "what")

    def __init__(self, ok: bool, what: str, pending: bool) -> None:
        self.ok = ok
        self.what = what
        self.pending = pending  # a 5xx whose request is still out (it counts once confirmed)


class _Record:
    __slots__ = (
        "attempts_at_start", "events", "num_ejections", "num_failures", "num_pardoned", "num_pending", "out",
        "until_s",
    )  # fmt: skip

    def __init__(self) -> None:
        self.events: deque[_Event] = deque()  # the run, in the order it happened, since the last settled one
        self.num_pending = 0
        self.num_failures = 0  # counted in this interval
        self.num_pardoned = 0  # attempts whose 5xx was pardoned in this interval: not judged
        self.attempts_at_start = 0  # the backend's num_attempts when this interval began
        self.num_ejections = 0
        self.until_s = 0.0  # monotonic time before which it stays out
        self.out = False  # ejected by these rules and not back yet

    def clear(self) -> None:
        for event in self.events:
            event.pending = False  # its confirmation or pardon comes to nothing
        self.events.clear()
        self.num_pending = 0


class OutlierDetector:
    def __init__(
        self,
        router: Router,
        settings: GatewaySection,
        take_out: Callable[[Backend, str], None],
        on_dropped: Callable[[Backend, int], None] | None = None,
    ) -> None:
        self.router = router
        self.settings = settings
        self.num_errors_to_eject = settings.outlier_consecutive_errors
        self.base_s = settings.outlier_base_ejection_s
        self.max_s = settings.outlier_max_ejection_s
        self.interval_s = settings.outlier_interval_s
        self.take_out = take_out
        self.on_dropped = on_dropped  # told of a pending 5xx pushed out of a history unsettled (the metric)
        self._records = {b: _Record() for b in router.backends}
        now = time.monotonic()
        self._next_judgment_s = {model: now + self.interval_s for model in router.pools}

    def success(self, backend: Backend) -> None:
        """A good start (a 200's headers) or a good end: the run before it is over."""
        record = self._records[backend]
        if record.num_pending:  # a run before it may still be completed by a confirmation
            self._add(backend, record, _Event(True, "", False))
        elif record.events:
            record.events.clear()  # every run before it is settled
        self._tick(backend.model)

    def failure(self, backend: Backend, what: str, pending: bool = False) -> _Event | None:
        """A failure now (`what`: connect, broken, or the status); `pending`: a 5xx that counts once
        `settle` confirms it. "broken" here is a stream that broke after its 200 (the relay's
        stream): it counts in the rates only (RequestFailures reports a close before the answer).
        Returns the event (None: not counted at all: the backend is out of the pool already)."""
        if not backend.healthy:
            return None
        record = self._records[backend]
        event = _Event(False, what, pending)
        if what == "broken" and not pending:
            record.num_failures += 1
        else:
            self._in_run(backend, record, event)
        self._tick(backend.model)
        return event

    def refused(self, backend: Backend, what: str) -> None:
        """A connection that failed or closed before any answer: counts in the rates and the run."""
        if backend.healthy:
            self._in_run(backend, self._records[backend], _Event(False, what, False))
        self._tick(backend.model)

    def _in_run(self, backend: Backend, record: _Record, event: _Event) -> None:
        """A failure into the run: a pending 5xx waits there; any other counts in the rates now and
        may complete the run."""
        self._add(backend, record, event)
        if event.pending:
            record.num_pending += 1
            return
        record.num_failures += 1
        self._check(backend, record)

    def settle(self, backend: Backend, event: _Event, counts: bool) -> None:
        """A pending 5xx's request was served elsewhere (counts) or failed everywhere (it does not)."""
        if not event.pending:
            return  # its history was cleared meanwhile
        record = self._records[backend]
        event.pending = False
        record.num_pending -= 1
        if counts:
            record.num_failures += 1
        else:
            record.num_pardoned += 1
            record.events.remove(event)
        self._check(backend, record)
        self._tick(backend.model)

    def _add(self, backend: Backend, record: _Record, event: _Event) -> None:
        if len(record.events) >= HISTORY:
            oldest = record.events.popleft()
            if oldest.pending:
                oldest.pending = False
                record.num_pending -= 1
                log.info("backend %s: a %s whose request never settled leaves the history uncounted",
                         backend.name, oldest.what)  # fmt: skip
                if self.on_dropped is not None:
                    self.on_dropped(backend, 1)
        record.events.append(event)

    def _check(self, backend: Backend, record: _Record) -> None:
        """Eject when the history holds N counted failures in a row."""
        if not self.num_errors_to_eject:
            return
        run = 0
        for event in record.events:
            run = 0 if event.ok or event.pending else run + 1
            if run >= self.num_errors_to_eject:
                break
        else:
            return
        record.clear()
        self._eject(backend, f"{run} failures in a row (outlier_consecutive_errors; last: {event.what})")

    def _tick(self, model: str) -> None:
        """Judge the model's backends when its interval is over (on the first event after it: a
        model without traffic has nothing to judge)."""
        now = time.monotonic()
        if now >= self._next_judgment_s[model]:
            self._next_judgment_s[model] = now + self.interval_s
            self.judge(model)

    def judge(self, model: str) -> None:
        """The rates of the interval that ends now; every backend of the model starts a new one."""
        tallies = []
        for b in self.router.pools[model].backends:
            record = self._records[b]
            num_attempts = b.num_attempts - record.attempts_at_start - record.num_pardoned
            if b.healthy:
                tallies.append(Tally(b.name, max(num_attempts, record.num_failures), record.num_failures))
            record.attempts_at_start = b.num_attempts
            record.num_failures = record.num_pardoned = 0
        if log.isEnabledFor(logging.DEBUG):
            log.debug("model %s, the last %g s: %s", model, self.interval_s,
                      ", ".join(f"{t.name} {t.num_failures} of {t.num_requests} failed" for t in tallies))  # fmt: skip
        for name, reason in verdict(tallies, self.settings):
            self._eject(next(b for b in self.router.pools[model].backends if b.name == name), reason)

    def _eject(self, backend: Backend, why: str) -> None:
        if not backend.healthy:
            return
        pool = self.router.pools[backend.model]
        if not pool.any_healthy(besides=backend):
            log.warning(
                "backend %s: %s; but it is the last healthy one of model %s: kept", backend.name, why, pool.model
            )
            return
        num_out = self._num_out(backend.model)
        pct = self.settings.max_ejection_percent
        if num_out and 100 * (num_out + 1) > pct * len(pool.backends):
            log.warning("backend %s: %s; but %d of model %s's %d backends are out already (max_ejection_percent "
                        "%g): kept", backend.name, why, num_out, pool.model, len(pool.backends), pct)  # fmt: skip
            return
        record = self._records[backend]
        now = time.monotonic()
        if now - record.until_s > self.max_s:  # it behaved for a long time: start from the base again
            record.num_ejections = 0
        record.num_ejections += 1
        eject_s = self.ejection_s(record.num_ejections)
        record.until_s = now + eject_s
        record.out = True
        self.take_out(backend, f"{why}; out for {eject_s:g} s")

    def _num_out(self, model: str) -> int:
        """The model's backends out of the pool by these rules now."""
        num = 0
        for b in self.router.pools[model].backends:
            record = self._records[b]
            record.out = record.out and not b.healthy
            num += record.out
        return num

    def for_request(self) -> RequestFailures:
        return RequestFailures(self)

    def ejection_s(self, num_ejections: int) -> float:
        """How long the num_ejections-th ejection in a row lasts."""
        return float(min(self.max_s, self.base_s * 2 ** min(num_ejections - 1, 32)))

    def held_s(self, backend: Backend) -> float:
        """Seconds it still stays out whatever its health check says (0: free to return)."""
        return max(0.0, self._records[backend].until_s - time.monotonic())


class RequestFailures:
    """One request's failures before its first byte: a connect error or close counts at once; a
    5xx answer is held in its backend's history until the request's outcome settles it."""

    __slots__ = ("_answers", "detector")

    def __init__(self, detector: OutlierDetector) -> None:
        self.detector = detector
        self._answers: list[tuple[Backend, _Event]] = []

    def failed(self, backend: Backend, what: str) -> None:
        if not what.isdigit():
            self.detector.refused(backend, what)
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
