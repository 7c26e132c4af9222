"""The load generator of bench/gateway_overhead.py, in a process of its own (so that it is
never part of what is measured): aiohttp on uvloop, `--concurrency` streams kept open, each
request's tokens counted as they arrive.

    python -m bench._loadgen --target direct=http://127.0.0.1:P --target gateway=http://... \
        --watch gateway=PID --watch upstream=PID [--key-for tenant=KEY] [--together gateway,tenant] \
        [--rounds 5] [--concurrency 256] --out rounds.json

Round after round it drives each target in turn (the order rotates each round, so no target
always goes first); targets named together in a --together are driven at the same time, in one
window, each with its own streams and its own key. In each round's measured window it counts
the tokens that arrive, takes each request's time to first byte (requests that started in the
window), and reads the CPU seconds of every watched process (/proc) and of itself at the
window's two edges.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

TOKEN = b'":" t'  # each token is " tK" in `"text":" tK"`
OVERHEAD_HEADER = "x-zerogap-overhead-ms"  # the gateway's: its own time before the head went, upstream waits left out


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux /proc); nan if it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Round:
    def __init__(self, warmup_s: float, measure_s: float) -> None:
        self.measure_from = time.monotonic() + warmup_s
        self.measure_to = self.measure_from + measure_s
        self.num_tokens = 0
        self.num_requests = 0  # answers that ended within the window (CPU per request)
        self.ttft_s: list[float] = []
        self.overhead_ms: list[float] = []  # the gateway's own time before the head (x-zerogap-overhead-ms)
        self.num_errors = 0

    def in_window(self, t: float) -> bool:
        return self.measure_from <= t < self.measure_to


async def one_stream(session: aiohttp.ClientSession, url: str, body: bytes, r: Round) -> None:
    start = time.monotonic()
    first = True
    async with session.post(url, data=body) as resp:
        if resp.status != 200:
            r.num_errors += 1
            await resp.read()
            return
        async for data in resp.content.iter_any():
            now = time.monotonic()
            if first:
                first = False
                if r.in_window(start):
                    r.ttft_s.append(now - start)
                    if (overhead := resp.headers.get(OVERHEAD_HEADER)) is not None:
                        r.overhead_ms.append(float(overhead))
            if r.in_window(now):
                r.num_tokens += data.count(TOKEN)
            elif now >= r.measure_to:
                return
    if r.in_window(time.monotonic()):
        r.num_requests += 1


async def worker(session: aiohttp.ClientSession, url: str, body: bytes, r: Round, delay_s: float) -> None:
    await asyncio.sleep(delay_s)  # streams start spread over one request's length, as real traffic does
    while time.monotonic() < r.measure_to:
        try:
            await one_stream(session, url, body, r)
        except (aiohttp.ClientError, OSError):
            r.num_errors += 1
            await asyncio.sleep(0.05)


async def cpu_window(r: Round, watch: dict[str, list[int]]) -> dict[str, float]:
    """CPU seconds of each watched process (and of this one) within the measured window."""

    def sample() -> dict[str, float]:
        out = {name: sum(cpu_s(p) for p in pids) for name, pids in watch.items()}
        out["loadgen"] = time.process_time()
        return out

    await asyncio.sleep(r.measure_from - time.monotonic())
    before, t0 = sample(), time.monotonic()
    await asyncio.sleep(r.measure_to - time.monotonic())
    after, wall_s = sample(), time.monotonic() - t0
    return {name: (after[name] - before[name]) / wall_s for name in after}  # share of one core


async def run_round(
    group: list[tuple[str, str]], args: argparse.Namespace, watch: dict[str, list[int]]
) -> list[dict[str, Any]]:
    """One window in which each (url, key) of the group gets its own `--concurrency` streams (one
    target, or several driven at the same time): each one's figures, with the CPU read once."""
    body = json.dumps(
        {"model": "bench", "prompt": "hello there", "stream": True, "max_tokens": args.max_tokens, "ignore_eos": True}
    ).encode()
    first = Round(args.warmup_s, args.round_s)
    rounds = [first, *(copy.copy(first) for _ in group[1:])]
    for r in rounds[1:]:
        r.ttft_s, r.overhead_ms = [], []
    sessions = [
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                              headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"})
        for _, key in group
    ]  # fmt: skip
    try:
        cpu = asyncio.ensure_future(cpu_window(first, watch))
        n = args.concurrency
        tasks = [
            asyncio.ensure_future(worker(session, url, body, r, i * args.spread_s / n))
            for (url, _), session, r in zip(group, sessions, rounds, strict=True) for i in range(n)
        ]  # fmt: skip
        await asyncio.wait(tasks, timeout=args.warmup_s + args.round_s + 30)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        cpu_share = await cpu
    finally:
        for session in sessions:
            await session.close()
    return [
        {
            "tps": r.num_tokens / args.round_s,
            "rps": r.num_requests / args.round_s,
            "ttft_s": r.ttft_s,
            "overhead_ms": r.overhead_ms,
            "num_errors": r.num_errors,
            "cpu": cpu_share,
        }
        for r in rounds
    ]


def groups(targets: list[str], together: list[str]) -> list[list[str]]:
    """The targets in the order given, those named together in one --together (NAME,NAME,...)
    joined into one group at the first one's place."""
    out: list[list[str]] = [[t] for t in targets]
    for spec in together:
        names = [n for n in spec.split(",") if n in targets]
        if len(names) < 2:
            continue
        first = next(g for g in out if names[0] in g)
        for name in names[1:]:
            g = next(g for g in out if name in g)
            if g is not first:
                first.extend(g)
                out.remove(g)
    return out


def parse_pairs(items: list[str]) -> dict[str, str]:
    return dict(item.split("=", 1) for item in items)


def main(argv: list[str] | None = None) -> int:
    import uvloop

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", action="append", required=True, help="NAME=BASE_URL, in the order to drive them")
    p.add_argument("--watch", action="append", default=[], help="NAME=PID[,PID...]: processes whose CPU to read")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--concurrency", type=int, default=256)
    p.add_argument("--warmup-s", type=float, default=4.0)
    p.add_argument("--round-s", type=float, default=8.0)
    p.add_argument("--spread-s", type=float, default=3.3, help="stream starts are spread over this long")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--key", default="bench-key", help="the key sent to every target without a --key-for")
    p.add_argument("--key-for", action="append", default=[], help="NAME=KEY: the key sent to this target")
    p.add_argument(
        "--together",
        action="append",
        default=[],
        help="NAME,NAME,...: targets driven at the same time in one window, each with its own --concurrency streams",
    )
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    urls = parse_pairs(args.target)
    watch = {name: [int(x) for x in pids.split(",")] for name, pids in parse_pairs(args.watch).items()}
    keys = parse_pairs(args.key_for)
    order = groups(list(urls), args.together)
    results = []
    for i in range(args.rounds):
        for j in range(len(order)):
            group = order[(i + j) % len(order)]
            driven = [(urls[name] + "/v1/completions", keys.get(name, args.key)) for name in group]
            for name, res in zip(group, uvloop.run(run_round(driven, args, watch)), strict=True):
                res.update(kind=name, round=i + 1)
                results.append(res)
                shown = " ".join(f"{k}={v:.0%}" for k, v in res["cpu"].items())
                ttft = sorted(res["ttft_s"])
                p50_ms = 1000 * ttft[len(ttft) // 2] if ttft else float("nan")
                print(
                    f"  round {i + 1}: {name:<13} {res['tps']:7.0f} tok/s  TTFT p50 {p50_ms:7.2f} ms  "
                    f"errors={res['num_errors']}  CPU of a core: {shown}",
                    file=sys.stderr,
                    flush=True,
                )
    Path(args.out).write_text(json.dumps(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
