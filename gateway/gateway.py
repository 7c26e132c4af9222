"""Everything one gateway app owns (kept on app.state.gateway), and its start and stop."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
from pathlib import Path

from common.config import Config
from common.net import public_url
from gateway.observe.metrics import GatewayMetrics, multiprocess_dir
from gateway.observe.rate_log import log_rates_forever
from gateway.observe.request_story import Observer
from gateway.pool.drain import Drain
from gateway.pool.flights import Flights
from gateway.pool.health import HealthMonitor
from gateway.pool.model_pool import Router
from gateway.pool.outlier import OutlierDetector
from gateway.relay.relay import Relay
from gateway.tenants.auth import Authenticator
from gateway.tenants.keys.auto import open_store
from gateway.tenants.limits import Limiter
from gateway.tenants.limits.memory import MemoryLimiter
from gateway.tenants.limits.sqlite import SHARED_LIMITS_ENV, SqliteLimiter
from gateway.tenants.usage import UsageRecorder
from gateway.upstream.client import UpstreamClient
from gateway.upstream.http_client import HttpUpstream

log = logging.getLogger("zerogap.gateway")

BACKEND_GAUGES_INTERVAL_S = 1.0


def make_limiter(config: Config, metrics: GatewayMetrics) -> Limiter:
    """Redis with [gateway].redis_url; else, as one of several workers, the workers' shared file;
    else this process's memory."""
    g = config.gateway
    if g.redis_url:
        from gateway.tenants.limits.redis import RedisLimiter  # redis is imported only when it is used (~0.7 s)

        down = metrics.limits_down
        down.labels(g.on_redis_down)  # the series exists from the start, at 0
        return RedisLimiter(g.redis_url, g.concurrency_lease_s, g.on_redis_down, lambda mode: down.labels(mode).inc())
    shared_file = os.environ.get(SHARED_LIMITS_ENV)
    if shared_file:
        return SqliteLimiter(Path(shared_file), g.concurrency_lease_s)
    return MemoryLimiter()


class Gateway:
    def __init__(self, config: Config, client: UpstreamClient | None = None) -> None:
        g = config.gateway
        self.config = config
        self.store = open_store(config)
        self.router = Router(config.pool(), g.routing, g.cache_aware, g.panic_routing)
        self.client: UpstreamClient = client or HttpUpstream(g.connect_timeout_s, g.max_connections_per_backend)
        self.metrics = GatewayMetrics(multiprocess_dir(), per_key=bool(config.server.metrics_key))
        self.metrics.start_at_zero(self.router)
        self.auth = Authenticator(config.server.api_key, self.store, g, self.metrics)
        self.limiter = make_limiter(config, self.metrics)
        self.usage = UsageRecorder(self.store)
        self.flights = Flights(g.eject_grace_s, on_leave=self.metrics.ejected)
        take_out = functools.partial(self.flights.take_out, cause="outlier")
        self.outlier = OutlierDetector(self.router, g, take_out, self.metrics.outlier_dropped)
        self.drain = Drain(self.flights, g.drain_timeout_s)
        self.observer = Observer(config)
        self.relay = Relay(
            g, self.client, self.metrics, self.limiter, self.usage, self.flights, self.outlier, self.observer
        )
        self.monitor = HealthMonitor(
            self.router,
            self.client,
            min(g.connect_timeout_s, 2.0),
            functools.partial(self.flights.take_out, cause="health"),
            self.outlier.held_s,
            g.unhealthy_threshold,
            g.healthy_threshold,
        )
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        g = self.config.gateway
        await self.store.open()
        self.observer.start()
        await self.auth.reload()
        await self.monitor.check_all()
        for b in self.router.backends:
            log.info("backend %s %s model=%s %s", b.name, public_url(b.url), b.model, "up" if b.healthy else "DOWN")
        if g.redis_url:
            from gateway.tenants.limits.redis import RedisLimiter

            if isinstance(self.limiter, RedisLimiter) and await self.limiter.ping():
                log.info("rate limits are shared through Redis")
        if not self.config.server.api_key:
            log.warning("[server].api_key is empty: the unified key is off, only virtual keys are accepted")
        self._tasks = [
            asyncio.create_task(self.monitor.check_forever(g.health_interval_s)),
            asyncio.create_task(self.monitor.scrape_forever(g.load_scrape_interval_s)),
            asyncio.create_task(self.auth.refresh_forever(g.key_refresh_interval_s)),
            asyncio.create_task(self.usage.flush_forever(g.usage_flush_interval_s)),
        ]
        logs = self.config.logging
        if logs.log_tps:
            m = self.metrics
            rates = log_rates_forever(m.tokens.metric, m.requests.metric, logs.log_interval_s, m.settled.flush)
            self._tasks.append(asyncio.create_task(rates))
        if self.metrics.multiprocess_dir is not None:
            self._tasks.append(asyncio.create_task(self._gauges_forever(BACKEND_GAUGES_INTERVAL_S)))

    async def _gauges_forever(self, interval_s: float) -> None:
        """With several workers, any of them may answer /metrics: each keeps its gauges current."""
        while True:
            self.metrics.set_backend_gauges(self.router)
            await asyncio.sleep(interval_s)

    async def stop(self) -> None:
        await self.drain.stop()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.usage.flush()
        await asyncio.to_thread(self.observer.stop)  # the spans still queued are sent
        await self.limiter.close()
        await self.client.close()
        await self.store.close()
