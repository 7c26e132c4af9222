"""Health checks with thresholds (real upstreams on free ports): one late answer ejects nothing,
unhealthy_threshold late answers in a row do, healthy_threshold passes bring a backend back."""

from __future__ import annotations

import asyncio
import signal
import time

import pytest

from common.config.gateway import BackendEntry, GatewaySection
from gateway.pool.health import HealthMonitor
from gateway.pool.model_pool import Backend, Router
from gateway.upstream.http_client import HttpUpstream
from tests.fixtures.upstream import UpstreamServer
from tests.gateway.faults import upstream_process
from tests.gateway.helpers import GatewayServer, get, make_config, metric

TIMEOUT_S = 0.3
LATE_S = 1.0  # a late answer: past TIMEOUT_S


async def test_one_late_answer_ejects_nothing_three_in_a_row_do_two_passes_return() -> None:
    with UpstreamServer(model="m") as up_a, UpstreamServer(model="m") as up_b:
        settings = GatewaySection()
        entries = [BackendEntry(name=n, url=u.url, model="m") for n, u in (("a", up_a), ("b", up_b))]
        router = Router(entries, settings.routing, settings.cache_aware)
        a, _ = router.backends
        left: list[str] = []

        def take_out(backend: Backend, reason: str) -> None:
            backend.healthy = False
            left.append(reason)

        client = HttpUpstream(2.0)
        monitor = HealthMonitor(
            router, client, TIMEOUT_S, take_out, unhealthy_threshold=3, healthy_threshold=2
        )  # the defaults
        try:

            async def check(late: bool) -> bool:
                up_a.behavior.health_delay_s = LATE_S if late else 0.0
                await monitor.check(a)
                return a.healthy

            assert await check(late=False)
            assert await check(late=True)  # one late answer: still in
            assert await check(late=False)  # and the run is over
            assert [await check(late=True) for _ in range(3)] == [True, True, False]  # the third in a row: out
            assert len(left) == 1 and "TimeoutError" in left[0] and "3 in a row" in left[0], left
            assert [await check(late=False) for _ in range(2)] == [False, True]  # the second pass: back
            assert await check(late=True) and await check(late=False)  # after a late one, passes count anew
        finally:
            up_a.behavior.health_delay_s = 0.0
            await client.close()


async def test_a_backend_down_at_start_is_out_at_its_first_check() -> None:
    with UpstreamServer(model="m") as up:
        up.stop()
        router = Router([BackendEntry(name="a", url=up.url, model="m")], "least_load")
        client = HttpUpstream(1.0)
        monitor = HealthMonitor(router, client, TIMEOUT_S, unhealthy_threshold=3, healthy_threshold=2)
        try:
            await monitor.check_all()
            assert not router.backends[0].healthy
        finally:
            await client.close()


@pytest.mark.parametrize("threshold", [1, 3])
async def test_a_pause_shorter_than_the_threshold_keeps_the_backend(tmp_path, threshold: int) -> None:
    """The upstream process pauses (SIGSTOP) 1.2 s: with a check every 0.5 s timing out after
    0.3 s, one or two checks fail. unhealthy_threshold = 3 keeps it; 1 (the old rule) ejects it,
    and it returns after healthy_threshold (2) passes."""
    settings = {"health_interval_s": 0.5, "connect_timeout_s": TIMEOUT_S, "unhealthy_threshold": threshold}
    with upstream_process() as paused, upstream_process() as other:
        config = make_config(tmp_path, [("a", paused.url, "m"), ("b", other.url, "m")], settings)
        with GatewayServer(config) as gs:
            a = gs.gw.router.backends[0]
            paused.signal(signal.SIGSTOP)
            out = False
            t0_s = time.monotonic()
            try:
                while time.monotonic() - t0_s < 1.2:
                    out = out or not a.healthy
                    await asyncio.sleep(0.01)
            finally:
                paused.signal(signal.SIGCONT)
            t0_s = time.monotonic()
            while time.monotonic() - t0_s < 1.0 + 2 * 0.5 and not (out and a.healthy):
                out = out or not a.healthy
                await asyncio.sleep(0.01)
            _, text = await get(gs.url + "/metrics")
    assert out == (threshold == 1)
    assert a.healthy, "back after two passes"
    assert metric(text, "zerogap_backend_ejections_total", backend="a", cause="health") == (threshold == 1)
