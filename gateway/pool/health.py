"""Active health checks (GET /health) and load scrapes (GET /metrics) of every backend."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable

from common.net import public_url
from common.promtext import sums_by_name
from gateway.pool.kv_listener import KvListener
from gateway.pool.model_pool import Backend, Router
from gateway.upstream.client import UpstreamClient

log = logging.getLogger("zerogap.gateway.health")

QUEUE_METRICS = ("vllm:num_requests_running", "vllm:num_requests_waiting")


def parse_queue(text: bytes) -> int:
    """running + waiting from a Prometheus text page (summed over label sets)."""
    return int(sum(sums_by_name(text, QUEUE_METRICS).values()))


def _never_held(backend: Backend) -> float:
    return 0.0


def _finished(checks: set[asyncio.Task[None]], task: asyncio.Task[None]) -> None:
    checks.discard(task)
    if not task.cancelled() and task.exception() is not None:
        log.error("a health check failed unexpectedly", exc_info=task.exception())


class HealthMonitor:
    """`take_out(backend, reason)` removes a backend that fails (and acts on its requests in
    flight); `held_s(backend)` > 0 keeps an ejected backend out even if it answers.

    A backend leaves after `unhealthy_threshold` failed checks in a row and comes back after
    `healthy_threshold` passes in a row (Envoy's names): one late answer (a collector pause, a
    loaded host) costs nothing. Its first check decides alone (a backend down at start is out at
    once). `check_forever` starts a check every interval whether or not the one before has
    answered, so that a frozen backend's checks time out one interval apart, not one timeout
    apart: it is out within (unhealthy_threshold - 1) x interval + the timeout of freezing (plus
    up to one interval), and its streams end `eject_grace_s` later (flights.py)."""

    def __init__(
        self,
        router: Router,
        client: UpstreamClient,
        timeout_s: float,
        take_out: Callable[[Backend, str], None] | None = None,
        held_s: Callable[[Backend], float] = _never_held,
        unhealthy_threshold: int = 1,
        healthy_threshold: int = 1,
    ) -> None:
        self.router = router
        self.client = client
        self.timeout_s = timeout_s
        self.take_out = take_out
        self.held_s = held_s
        self.unhealthy_threshold = unhealthy_threshold
        self.healthy_threshold = healthy_threshold
        self._in_row: dict[Backend, int] = {}  # > 0: passes in a row, < 0: failures in a row
        self._was_healthy: dict[Backend, bool] = {}  # at its last check (absent: never checked)

    async def check(self, backend: Backend) -> None:
        try:
            status, _ = await self.client.get(backend.url + "/health", self.timeout_s)
            ok = status == 200
            reason = f"status {status}"
        except Exception as exc:  # any failure to answer means: not healthy
            ok, reason = False, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        self.judge(backend, ok, reason)

    def judge(self, backend: Backend, ok: bool, reason: str) -> None:
        """One check's result, in the order the results came."""
        first = backend not in self._was_healthy
        if self._was_healthy.get(backend) and not backend.healthy:  # it left meanwhile (outlier, refused)
            self._in_row[backend] = min(self._in_row.get(backend, 0), 0)
        num = self._in_row.get(backend, 0)
        num = self._in_row[backend] = max(num, 0) + 1 if ok else min(num, 0) - 1
        if ok and not backend.healthy and (first or num >= self.healthy_threshold):
            self._back(backend)
        elif not ok and backend.healthy:
            if first or -num >= self.unhealthy_threshold:
                self._leave(backend, f"health check failed ({reason}), {-num} in a row")
            else:
                log.info("backend %s (%s) failed a health check (%s): %d of unhealthy_threshold %d in a row",
                         backend.name, public_url(backend.url), reason, -num, self.unhealthy_threshold)  # fmt: skip
        self._was_healthy[backend] = backend.healthy

    def _back(self, backend: Backend) -> None:
        held_s = self.held_s(backend)
        if held_s > 0:
            if self.router.pools[backend.model].any_healthy(besides=backend):
                return  # ejected: not back before its time is up (but never leaving its model empty)
            shown = public_url(backend.url)
            log.warning("backend %s (%s) comes back %.0f s before its ejection ends: no other backend of "
                        "model %s is healthy", backend.name, shown, held_s, backend.model)  # fmt: skip
        else:
            log.info("backend %s (%s) is healthy again", backend.name, public_url(backend.url))
        backend.healthy = True

    def _leave(self, backend: Backend, reason: str) -> None:
        if self.take_out is None:
            log.warning("backend %s (%s) leaves the pool: %s", backend.name, public_url(backend.url), reason)
            backend.healthy = False
        else:
            self.take_out(backend, reason)

    async def scrape(self, backend: Backend) -> None:
        if not backend.healthy:
            return
        try:
            status, text = await self.client.get(backend.url + "/metrics", self.timeout_s)
        except Exception as exc:
            log.debug("load scrape of %s failed: %s", backend.name, exc)
            return
        backend.num_reported = parse_queue(text) if status == 200 else 0
        backend.num_inflight_at_scrape = backend.num_inflight

    async def check_all(self) -> None:
        await asyncio.gather(*(self.check(b) for b in self.router.backends))

    async def scrape_all(self) -> None:
        await asyncio.gather(*(self.scrape(b) for b in self.router.backends))
        self.router.observe_loads(time.monotonic())

    async def check_forever(self, interval_s: float) -> None:
        """A check of every backend each interval, each on its own (a late one delays no other)."""
        checks: set[asyncio.Task[None]] = set()
        try:
            while True:
                await asyncio.sleep(interval_s)
                for b in self.router.backends:
                    task = asyncio.create_task(self.check(b))
                    checks.add(task)
                    task.add_done_callback(functools.partial(_finished, checks))
        finally:
            for task in checks:
                task.cancel()
            await asyncio.gather(*checks, return_exceptions=True)

    async def scrape_forever(self, interval_s: float) -> None:
        """Every interval_s, or more often when a routing policy asks (cache_aware: 0.1 s). The engines'
        KV-cache events (routing = "kv_events") are followed meanwhile, in this process too."""
        interval_s = self.router.scrape_interval_s(interval_s)
        listener = KvListener(self.router)
        listener.start()
        try:
            while True:
                await self.scrape_all()
                await asyncio.sleep(interval_s)
        finally:
            await listener.close()
