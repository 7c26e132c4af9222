"""Step-loop lag of one `zerogap sim` process: 1,024 concurrent streams vs 32, side by side.

    .venv/bin/python bench/sim_step_lag.py [--streams 1024] [--low-streams 32] [--measure-s 15]

One sim process at time-scale 1 (async + slot reuse, max_num_seqs = the high stream
count, so every stream decodes every step); the load generator runs in another
process (this script with --client). Prints the lag (actual - scheduled step start)
p50/p99 at low and at high load and their ratio. Target: p99 < 2 ms at 1,024.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
import urllib.request

import aiohttp

from backends.sim.testing import run_sim_process

PROMPT = " ".join(f"w{i}" for i in range(128))


async def _user(session: aiohttp.ClientSession, url: str, deadline: float, counts: list[int]) -> None:
    body = {"prompt": PROMPT, "max_tokens": 256, "ignore_eos": True, "stream": True}
    while time.monotonic() < deadline:
        async with session.post(f"{url}/v1/completions", json=body) as response:
            async for line in response.content:
                if line.startswith(b"data: {"):
                    counts[0] += 1
                if time.monotonic() > deadline:
                    return


async def _client(url: str, streams: int, duration_s: float) -> None:
    deadline = time.monotonic() + duration_s
    counts = [0]
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=duration_s + 60)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        await asyncio.gather(*(_user(session, url, deadline, counts) for _ in range(streams)))
    print(json.dumps({"chunks": counts[0], "chunks_per_s": counts[0] / duration_s}))


def _get(url: str, method: str = "GET") -> dict:
    request = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)
    with urllib.request.urlopen(request, timeout=10) as response:
        result: dict = json.loads(response.read())
        return result


def measure(url: str, streams: int, warmup_s: float, measure_s: float) -> dict:
    duration = str(warmup_s + measure_s)
    cmd = [sys.executable, __file__, "--client", url, "--streams", str(streams), "--duration-s", duration]
    client = subprocess.Popen(cmd, stdout=subprocess.PIPE)
    try:
        time.sleep(warmup_s)
        _get(f"{url}/sim/stats/reset", "POST")
        time.sleep(measure_s)
        stats = _get(f"{url}/sim/stats")
        out, _ = client.communicate(timeout=120)
    finally:
        if client.poll() is None:
            client.kill()
            client.wait()
    stats["client"] = json.loads(out.decode().strip().splitlines()[-1])
    return stats


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=1024)
    parser.add_argument("--low-streams", type=int, default=32)
    parser.add_argument("--warmup-s", type=float, default=8.0)
    parser.add_argument("--measure-s", type=float, default=15.0)
    parser.add_argument("--client", help=argparse.SUPPRESS)
    parser.add_argument("--duration-s", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        asyncio.run(_client(args.client, args.streams, args.duration_s))
        return 0
    sim_args = ("--time-scale", "1", "--scheduling", "async", "--slot-reuse", "--max-num-seqs", str(args.streams))
    with run_sim_process(*sim_args) as sim:
        low = measure(sim.url, args.low_streams, args.warmup_s, args.measure_s)
        high = measure(sim.url, args.streams, args.warmup_s, args.measure_s)
    for name, n, stats in (("low", args.low_streams, low), ("high", args.streams, high)):
        lag, work = stats["step_lag_ms"], stats["step_work_ms"]
        print(
            f"{name:>4}: {n:5d} streams  running {stats['num_running']:5d}  steps {lag['num_steps']:5d}  "
            f"lag p50 {lag['p50']:.3f} ms  p99 {lag['p99']:.3f} ms  max {lag['max']:.3f} ms  "
            f"step work p50/p99 {work['p50']:.2f}/{work['p99']:.2f} ms  gc max {stats['gc_pause_ms']['max']:.1f} ms  "
            f"client {stats['client']['chunks_per_s']:.0f} chunks/s"
        )
    ratio = high["step_lag_ms"]["p99"] / max(low["step_lag_ms"]["p99"], 1e-6)
    verdict = "PASS" if high["step_lag_ms"]["p99"] < 2.0 else "FAIL"
    print(f"lag p99 high/low = {ratio:.2f}x; p99 at {args.streams} streams < 2 ms: {verdict}")
    print(f"machine load average at the end: {open('/proc/loadavg').read().split()[0]} (2 cores are shared)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
