"""`zerogap gateway --workers 2`: one port, /metrics summed over the workers, a dead worker
restarted, SIGTERM stops them all."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import aiohttp
import psutil

from common.net import free_port
from gateway.tenants.keys.base import KeyLimits
from gateway.tenants.keys.sqlite import KeyStore
from tests.fixtures.upstream import Behavior, UpstreamServer
from tests.gateway.concurrent_streams import (
    NUM_TOKENS,
    SLOW,
    check_split,
    eventually,
    new_key,
    status_is,
    status_of,
    streams,
)
from tests.gateway.processes import UNIFIED, GatewayProcess, call, chat, metric_sum, write_config

NUM_REQUESTS = 24


def stream(base: str) -> tuple[int, str]:
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    return call(base + "/v1/chat/completions", UNIFIED, body)


def wait_until(pred, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return False


def test_two_workers_share_a_port_sum_metrics_restart_and_stop(tmp_path: Path) -> None:
    port = free_port()
    with UpstreamServer(model="m") as up:
        gw = GatewayProcess(write_config(tmp_path / "config.toml", port, up.url, {}), port, workers=2).start()
        try:
            first = gw.worker_pids()
            assert len(first) == 2
            # Fresh connections: SO_REUSEPORT spreads them over both workers.
            assert [chat(gw.url, UNIFIED)[0] for _ in range(NUM_REQUESTS)] == [200] * NUM_REQUESTS
            for _ in range(6):  # whichever worker answers /metrics shows the sum of both
                status, text = call(gw.url + "/metrics")
                assert status == 200
                assert metric_sum(text, "zerogap_requests_total", status="200") == NUM_REQUESTS
                assert metric_sum(text, "zerogap_backend_up", backend="b0") == 1

            psutil.Process(first[0]).kill()
            assert wait_until(lambda: gw.serving() and first[0] not in gw.worker_pids(), 60)
            assert chat(gw.url, UNIFIED)[0] == 200
            _, text = call(gw.url + "/metrics")
            assert metric_sum(text, "zerogap_requests_total", status="200") >= NUM_REQUESTS + 1  # kept the dead one's
            workers = [psutil.Process(pid) for pid in gw.worker_pids()]
        finally:
            code = gw.stop()
    assert code == 0, gw.logs()
    assert not any(w.is_running() and w.status() != psutil.STATUS_ZOMBIE for w in workers)
    assert "exited with code" in gw.logs() and "Traceback" not in gw.logs()


def test_workers_share_one_rate_limit_budget_without_redis(tmp_path: Path) -> None:
    port = free_port()
    with UpstreamServer(model="m") as up:
        config = write_config(tmp_path / "config.toml", port, up.url, {"usage_flush_interval_s": 60})
        store = KeyStore(tmp_path / "keys.db")
        key = store.create("limited", limits=KeyLimits(rpm=10))
        store.close()
        with GatewayProcess(config, port, workers=2) as gw:
            start = time.monotonic()
            statuses = [chat(gw.url, key)[0] for _ in range(20)]  # fresh connections: both workers
            elapsed_s = time.monotonic() - start
            up.behavior.interval_s = 0.1  # a stream of 1.6 s in flight at Ctrl-C
            with ThreadPoolExecutor(1) as pool:
                streaming = pool.submit(stream, gw.url)
                time.sleep(0.4)
                code = gw.interrupt()  # Ctrl-C: each worker drains once and flushes its usage on the way out
                status, body = streaming.result(10)
    assert status == 200 and body.endswith("data: [DONE]\n\n") and '"error"' not in body, body[-300:]
    assert set(statuses) == {200, 429}
    assert 10 <= statuses.count(200) <= 10 + elapsed_s * 10 / 60 + 1, (statuses, elapsed_s)
    assert code == 0, gw.logs()
    store = KeyStore(tmp_path / "keys.db")
    usage = {u.key_name: u.num_requests for u in store.usage()}
    assert usage == {"limited": statuses.count(200), "unified": 1}, gw.logs()


async def test_workers_share_one_max_concurrency_without_redis(tmp_path: Path) -> None:
    """12 streams over fresh connections (the kernel spreads them over both workers) on a key of
    4: exactly 4 admitted, through the workers' shared file. Workers killed while they hold slots:
    their leases lapse and their restarted successors admit 4 again."""
    port = free_port()
    behavior = Behavior(interval_s=SLOW, num_output_tokens=NUM_TOKENS)
    with UpstreamServer(behavior, model="m") as up:
        config = write_config(tmp_path / "config.toml", port, up.url, {"concurrency_lease_s": 1.0})
        key = new_key(tmp_path, "pool", 4)
        with GatewayProcess(config, port, workers=2) as gw:
            check_split(await streams([gw.url] * 12, key, up), 4)
            up.behavior.stall_after_tokens = 2  # from now on a stream ends only when its client leaves
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session:
                url, body = (
                    gw.url + "/v1/chat/completions",
                    {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]},
                )
                held = [
                    await session.post(url, json=body, headers={"Authorization": f"Bearer {key}"}) for _ in range(4)
                ]
                assert [r.status for r in held] == [200] * 4
                assert await status_of(gw.url, key) == 429
                old = gw.worker_pids()
                for pid in old:
                    psutil.Process(pid).kill()
                assert wait_until(lambda: gw.serving() and not set(old) & set(gw.worker_pids()), 60)
                for resp in held:
                    resp.close()
            up.behavior.stall_after_tokens = None
            up.behavior.interval_s = SLOW
            await eventually(lambda: status_is(gw.url, key, 200), 15)  # the dead workers' leases lapsed (1 s)
            check_split(await streams([gw.url] * 6, key, up), 4)
