"""Passive outlier detection: a backend whose requests fail N times in a row leaves the pool at
once, without waiting for the next health check.

Failures are connect errors, connections reset (before or during a stream) and 5xx answers.
Each counts when it happens, and so do successes, so that one kind of event cannot always win
the race to the count: a 200 counts when its headers come (as a 5xx does; not at the first
token, which can take seconds), and a stream that ends well counts again when it ends (as a
break does). Otherwise, when least load sends every new request to a backend back from an
ejection, the other hears only the breaks of its streams in flight and leaves at once.

An ejected backend stays out for a base time that doubles on each repeat (30, 60, 120, 240,
300 s by default) and comes back at the first health check that passes after it. A backend that
has stayed in the pool for the longest ejection time starts again from the base time. The last
healthy backend of a model is never ejected (a failing backend still beats a 503 for everyone).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from gateway.pool import Backend, Router
from zerogap.config.gateway import GatewaySection

log = logging.getLogger("zerogap.gateway.outlier")


class _Record:
    __slots__ = ("num_ejections", "num_errors", "until_s")

    def __init__(self) -> None:
        self.num_errors = 0  # failures in a row
        self.num_ejections = 0
        self.until_s = 0.0  # monotonic time before which it stays out


class OutlierDetector:
    def __init__(self, router: Router, settings: GatewaySection, take_out: Callable[[Backend, str], None]) -> None:
        self.router = router
        self.num_errors_to_eject = settings.outlier_consecutive_errors
        self.base_s = settings.outlier_base_ejection_s
        self.max_s = settings.outlier_max_ejection_s
        self.take_out = take_out
        self._records = {b: _Record() for b in router.backends}

    def success(self, backend: Backend) -> None:
        self._records[backend].num_errors = 0

    def failure(self, backend: Backend, what: str) -> None:
        record = self._records[backend]
        record.num_errors += 1
        if not self.num_errors_to_eject or record.num_errors < self.num_errors_to_eject or not backend.healthy:
            return
        if not self.router.pools[backend.model].any_healthy(besides=backend):
            log.warning("backend %s failed %d times in a row but is the last healthy one of model %s: kept",
                        backend.name, record.num_errors, backend.model)  # fmt: skip
            return
        now = time.monotonic()
        if now - record.until_s > self.max_s:  # it behaved for a long time: start from the base again
            record.num_ejections = 0
        record.num_ejections += 1
        eject_s = self.ejection_s(record.num_ejections)
        record.until_s = now + eject_s
        record.num_errors = 0
        self.take_out(backend, f"{self.num_errors_to_eject} failures in a row (last: {what}); out for {eject_s:g} s")

    def ejection_s(self, num_ejections: int) -> float:
        """How long the num_ejections-th ejection in a row lasts."""
        return float(min(self.max_s, self.base_s * 2 ** min(num_ejections - 1, 32)))

    def held_s(self, backend: Backend) -> float:
        """Seconds it still stays out whatever its health check says (0: free to return)."""
        return max(0.0, self._records[backend].until_s - time.monotonic())
