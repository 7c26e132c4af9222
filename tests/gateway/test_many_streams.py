"""2,048 streams at once through one gateway process: the load at which the peers give way
(vLLM production-stack's router crashes above 1,000 concurrent requests; LiteLLM's throughput
collapses at a few hundred streams). Real processes on loopback: the fixture upstream,
`zerogap gateway`, and this client.

Every stream must finish with every token, the gateway must pass them all on at once (the
upstream sees them all running together: nothing queued or capped behind the client's back;
checked by hand: max_connections_per_backend = 1000 fails here), and it must let go of them
all afterwards (in flight back to 0, asyncio tasks back near idle)."""

from __future__ import annotations

import asyncio
import resource
import time
from pathlib import Path

import aiohttp

from common.net import free_port
from tests.gateway.faults import gateway_process, one, session, stream_body, upstream_process
from tests.gateway.processes import UNIFIED, metric_sum, write_config

NUM_STREAMS = 2048
NUM_TOKENS = 8
TTFT_S = 5.0  # every stream still waits for its first token when the last one arrives (~2 s to send all)
INTERVAL_S = 0.1
HELD_SHARE = 0.95  # a cap or a queue in front of the upstream shows as far fewer held there


async def read_metrics(client: aiohttp.ClientSession, url: str) -> str:
    async with client.get(url + "/metrics") as resp:
        return await resp.text()


async def peak_running(upstream_url: str, stop: asyncio.Event, peaks: list[float]) -> None:
    """The requests the upstream holds at once, every 0.2 s."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as client:
        while not stop.is_set():
            try:
                page = await read_metrics(client, upstream_url)  # waiting: before its first token
                peaks.append(
                    metric_sum(page, "vllm:num_requests_running") + metric_sum(page, "vllm:num_requests_waiting")
                )
            except (aiohttp.ClientError, TimeoutError):
                pass
            await asyncio.sleep(0.2)


def open_files_for(num_sockets: int) -> None:
    """This client and the upstream it starts hold a socket per stream: raise the soft limit
    (often 1,024) to the hard one, and fail with the fix when even that is too low."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 65536)
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    assert target >= num_sockets + 256, f"open-files limit {target} < {num_sockets + 256}: raise it (ulimit -Hn)"


async def test_2048_streams_at_once(tmp_path: Path) -> None:
    open_files_for(NUM_STREAMS)  # before the upstream starts: it inherits the limit
    args = ("--ttft-s", str(TTFT_S), "--interval-s", str(INTERVAL_S))
    with upstream_process(*args) as up:
        port = free_port()
        # 2,048 streams from one client: above [server].max_connections_per_client's default (1,024)
        server = "max_connections_per_client = 10000"
        config = write_config(tmp_path / "gateway.toml", port, f"http://127.0.0.1:{up.port}", {}, server)
        with gateway_process(config, port, tmp_path / "gateway.log"):
            url = f"http://127.0.0.1:{port}"
            stop, peaks = asyncio.Event(), list[float]()
            watcher = asyncio.create_task(peak_running(f"http://127.0.0.1:{up.port}", stop, peaks))
            started_s = time.monotonic()
            async with session() as s:
                seen = await asyncio.gather(
                    *(one(s, url, stream_body(NUM_TOKENS), 60, key=UNIFIED) for _ in range(NUM_STREAMS))
                )
            took_s = time.monotonic() - started_s
            stop.set()
            await watcher
            await asyncio.sleep(0.5)
            async with aiohttp.ClientSession() as client:
                after = await read_metrics(client, url)
    log = (tmp_path / "gateway.log").read_text(errors="replace")
    failed = [(r.status, r.raw[-200:]) for r in seen if not (r.finished and r.num_tokens == NUM_TOKENS)]
    assert not failed, (len(failed), failed[:3], log[-2000:])
    assert max(peaks) >= HELD_SHARE * NUM_STREAMS, (max(peaks), took_s)
    assert took_s < TTFT_S + NUM_TOKENS * INTERVAL_S + 20, took_s
    assert metric_sum(after, "zerogap_backend_inflight") == 0
    assert metric_sum(after, "zerogap_requests_total", status="200") == NUM_STREAMS
    assert metric_sum(after, "zerogap_event_loop_tasks") < 64, "tasks left behind by 2,048 finished streams"
    assert "Traceback" not in log
