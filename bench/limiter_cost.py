"""What one request's limits cost the gateway's process, per limiter, side by side in one run.

A request of a key with rpm, tpm and max_concurrency goes through its limiter four times: admit
(at the headers: rpm and a slot), reserve (after the body: the tpm estimate), settle (at its end:
the estimate replaced by what it used) and release (the slot). This drives that cycle for
`--requests` requests, `--concurrency` at a time, through each limiter in one process and reads
the process's CPU time (user + system: the system calls to Redis included) and the wall time:

  memory   this process's memory (one worker, no [gateway].redis_url)
  redis    gateway/tenants/limits/redis.py against a redis-server the bench starts on a free port
  previous the same from another source tree (`--previous DIR`, e.g. a `git archive` of an older
           commit), imported under its own name: before and after, side by side

Each limiter runs `--rounds` times in rotating order; every figure is the median [min..max]
over the rounds. CPU time moves little with the machine's load; wall time does.

    .venv/bin/python -m bench.limiter_cost [--requests 5000] [--concurrency 64] [--previous DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from bench._peers import REDIS_INSTALL, find_redis, redis_command
from common.net import free_port, wait_for_port
from common.process_group import stop_process
from gateway.tenants.auth import Principal
from gateway.tenants.keys.base import KeyLimits
from gateway.tenants.limits.memory import MemoryLimiter
from gateway.tenants.limits.redis import RedisLimiter

KEY = {"rpm": 10**9, "tpm": 10**12, "max_concurrency": 100_000}  # checked and counted, never refusing


def previous_redis_limiter(src: Path) -> Any:
    """RedisLimiter of another source tree: its gateway/tenants/limits/redis.py (gateway/limits/redis.py in
    trees before the gateway's rooms) loaded under a name of its own; what it imports (the rule, the
    leases, the scripts) is this tree's, so compare trees whose other limits modules are the same
    (`git diff A B -- gateway/tenants/limits/`)."""
    found = [p for p in (src / "gateway/tenants/limits/redis.py", src / "gateway/limits/redis.py") if p.is_file()]
    if not found:
        raise SystemExit(f"--previous {src}: no gateway/tenants/limits/redis.py (or gateway/limits/redis.py) there")
    spec = importlib.util.spec_from_file_location("previous_limits_redis", found[0])
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.RedisLimiter


async def cycle(limiter: Any, who: Principal, n: int, concurrency: int) -> None:
    async def one() -> None:
        slot = await limiter.admit(who)
        await limiter.reserve(who, 200, 96)
        limiter.settle(who, 200, 150)
        limiter.release(slot)

    for start in range(0, n, concurrency):
        await asyncio.gather(*(one() for _ in range(min(concurrency, n - start))))
    if hasattr(limiter, "idle"):
        await limiter.idle()


async def measure(make: Any, args: argparse.Namespace, round_no: int, down: list[str]) -> tuple[float, float]:
    """CPU and wall µs per request of one round (the limiter made and warmed up first); `down` gets
    a word for each request a Redis limiter counted in memory instead (Redis unreachable for it)."""
    limiter = make(down.append)
    who = Principal(f"bench-{round_no}-{time.monotonic_ns()}", limits=KeyLimits(**KEY))
    try:
        await cycle(limiter, who, min(500, args.requests), args.concurrency)  # connections, scripts loaded
        cpu0, wall0 = time.process_time(), time.perf_counter()
        await cycle(limiter, who, args.requests, args.concurrency)
        cpu1, wall1 = time.process_time(), time.perf_counter()
    finally:
        await limiter.close()
    return 1e6 * (cpu1 - cpu0) / args.requests, 1e6 * (wall1 - wall0) / args.requests


def spread(values: list[float], digits: int = 1) -> str:
    return f"{statistics.median(values):.{digits}f} [{min(values):.{digits}f}..{max(values):.{digits}f}]"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=5000, help="requests per limiter per round")
    p.add_argument("--concurrency", type=int, default=64, help="requests in flight at once")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--tokens", type=int, default=64, help="tokens per request, for the per-token column")
    p.add_argument("--previous", metavar="DIR", help="also the Redis limiter of this source tree")
    args = p.parse_args(argv)
    redis = find_redis()
    if redis is None:
        raise SystemExit(f"redis-server is not installed ({REDIS_INSTALL})")
    import uvloop

    with tempfile.TemporaryDirectory(prefix="zerogap-limiter-cost-") as tmp:
        port = free_port()
        proc = subprocess.Popen(redis_command(redis, Path(tmp) / "redis", port), stdout=subprocess.DEVNULL)
        try:
            wait_for_port(port, 30, proc)
            url = f"redis://127.0.0.1:{port}/0"
            makers: dict[str, Any] = {
                "memory": lambda count: MemoryLimiter(),
                "redis": lambda count: RedisLimiter(url, 60.0, count_down=count),
            }
            if args.previous:
                previous = previous_redis_limiter(Path(args.previous).resolve())
                makers["previous"] = lambda count: previous(url, 60.0, count_down=count)
            cpu: dict[str, list[float]] = {name: [] for name in makers}
            wall: dict[str, list[float]] = {name: [] for name in makers}
            down: dict[str, list[str]] = {name: [] for name in makers}
            names = list(makers)
            for r in range(args.rounds):
                for j in range(len(names)):
                    name = names[(r + j) % len(names)]
                    c, w = uvloop.run(measure(makers[name], args, r, down[name]))
                    cpu[name].append(c)
                    wall[name].append(w)
        finally:
            stop_process(proc)
    print(
        f"{args.requests} requests per round, {args.concurrency} at a time, {args.rounds} rounds; "
        f"{os.cpu_count()} cores, load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}"
    )
    print(f"| limiter | CPU per request | per token (at {args.tokens} tokens a request) | wall per request |")
    print("| --- | --- | --- | --- |")
    for name in makers:
        per_token = [c / args.tokens for c in cpu[name]]
        print(f"| {name} | {spread(cpu[name])} µs | {spread(per_token, 2)} µs | {spread(wall[name])} µs |")
    for name in makers:
        if down[name]:
            print(f"NOTE: {name} counted {len(down[name])} requests in memory, Redis unreachable for them: "
                  "its figure is not all Redis's")  # fmt: skip
    if "previous" in makers:
        ratios = [a / b for a, b in zip(cpu["redis"], cpu["previous"], strict=True)]
        print(f"redis vs previous, CPU per request (within each round): {spread(ratios, 3)}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
