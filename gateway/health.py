"""Active health checks (GET /health) and load scrapes (GET /metrics) of every backend."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from gateway.pool import Backend, Router
from gateway.upstream import UpstreamClient
from zerogap.promtext import sums_by_name

log = logging.getLogger("zerogap.gateway.health")

QUEUE_METRICS = ("vllm:num_requests_running", "vllm:num_requests_waiting")


def parse_queue(text: bytes) -> int:
    """running + waiting from a Prometheus text page (summed over label sets)."""
    return int(sum(sums_by_name(text, QUEUE_METRICS).values()))


def _never_held(backend: Backend) -> float:
    return 0.0


class HealthMonitor:
    """`take_out(backend, reason)` removes a backend that fails (and acts on its requests in
    flight); `held_s(backend)` > 0 keeps an ejected backend out even if it answers."""

    def __init__(
        self,
        router: Router,
        client: UpstreamClient,
        timeout_s: float,
        take_out: Callable[[Backend, str], None] | None = None,
        held_s: Callable[[Backend], float] = _never_held,
    ) -> None:
        self.router = router
        self.client = client
        self.timeout_s = timeout_s
        self.take_out = take_out
        self.held_s = held_s

    async def check(self, backend: Backend) -> None:
        try:
            status, _ = await self.client.get(backend.url + "/health", self.timeout_s)
            ok = status == 200
            reason = f"status {status}"
        except Exception as exc:  # any failure to answer means: not healthy
            ok, reason = False, f"{type(exc).__name__}: {exc}"
        if ok and not backend.healthy:
            held_s = self.held_s(backend)
            if held_s > 0:
                if self.router.pools[backend.model].any_healthy(besides=backend):
                    return  # ejected: not back before its time is up (but never leaving its model empty)
                log.warning("backend %s (%s) comes back %.0f s before its ejection ends: no other backend of "
                            "model %s is healthy", backend.name, backend.url, held_s, backend.model)  # fmt: skip
            else:
                log.info("backend %s (%s) is healthy again", backend.name, backend.url)
            backend.healthy = True
        elif not ok and backend.healthy:
            if self.take_out is None:
                log.warning("backend %s (%s) leaves the pool: %s", backend.name, backend.url, reason)
                backend.healthy = False
            else:
                self.take_out(backend, f"health check failed ({reason})")

    async def scrape(self, backend: Backend) -> None:
        if not backend.healthy:
            return
        try:
            status, text = await self.client.get(backend.url + "/metrics", self.timeout_s)
        except Exception as exc:
            log.debug("load scrape of %s failed: %s", backend.name, exc)
            return
        backend.num_reported = parse_queue(text) if status == 200 else 0

    async def check_all(self) -> None:
        await asyncio.gather(*(self.check(b) for b in self.router.backends))

    async def scrape_all(self) -> None:
        await asyncio.gather(*(self.scrape(b) for b in self.router.backends))

    async def check_forever(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            await self.check_all()

    async def scrape_forever(self, interval_s: float) -> None:
        while True:
            await self.scrape_all()
            await asyncio.sleep(interval_s)
