"""Step-loop lag of one `zerogap sim` process: 1,024 concurrent streams vs 32, side by side,
and at equal slack.

    .venv/bin/python bench/sim_step_lag.py [--streams 1024] [--low-streams 32] [--measure-s 15] [--repeats 3]

A step's lag (actual - scheduled start) only shows when the loop's own work per step (apply
the step, hand out its tokens, schedule the next) comes near the step's modelled length: the
slack is step period - step work. At time-scale 1, 32 streams make short steps with little
work and 1,024 long steps with much work: two regimes. So each repeat measures three runs:

    low    32 streams at time-scale 1
    high   1,024 streams at time-scale 1
    equal  32 streams at the time-scale that gives them the high run's slack
           (its period scaled so that period - work matches; work does not scale)

and prints, per run, the step period, the step work p50/p99, the slack, and the lag
p50/p99, then the lag p99 ratios high/low and high/equal (the one at equal slack says
whether more streams cost lag by themselves). Each sim runs async + slot reuse with
max_num_seqs = the high stream count; the load generator is another process (this script
with --client). Over the repeats each figure is printed as median [min..max].
Target: lag p99 < 2 ms at 1,024 streams.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
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


def run(sim_args: tuple[str, ...], time_scale: float, streams: int, args: argparse.Namespace) -> dict:
    with run_sim_process(*sim_args, "--time-scale", f"{time_scale:.4f}") as sim:
        stats = measure(sim.url, streams, args.warmup_s, args.measure_s)
    lag, work = stats["step_lag_ms"], stats["step_work_ms"]
    period_ms = 1000 * args.measure_s / max(1, lag["num_steps"])
    return {"streams": streams, "time_scale": time_scale, "period_ms": period_ms, "work_p50_ms": work["p50"],
            "work_p99_ms": work["p99"], "slack_ms": period_ms - work["p50"], "lag_p50_ms": lag["p50"],
            "lag_p99_ms": lag["p99"], "num_running": stats["num_running"],
            "chunks_per_s": stats["client"]["chunks_per_s"]}  # fmt: skip


def show(name: str, r: dict) -> None:
    print(
        f"{name:>5}: {r['streams']:5d} streams  time-scale {r['time_scale']:.2f}  running {r['num_running']:5d}  "
        f"step period {r['period_ms']:.3f} ms  work p50/p99 {r['work_p50_ms']:.3f}/{r['work_p99_ms']:.3f} ms  "
        f"slack {r['slack_ms']:.3f} ms  lag p50 {r['lag_p50_ms']:.3f} ms  p99 {r['lag_p99_ms']:.3f} ms  "
        f"client {r['chunks_per_s']:.0f} chunks/s",
        flush=True,
    )


def one_repeat(args: argparse.Namespace) -> dict[str, dict]:
    sim_args = ("--scheduling", "async", "--slot-reuse", "--max-num-seqs", str(args.streams))
    low = run(sim_args, 1.0, args.low_streams, args)
    show("low", low)
    high = run(sim_args, 1.0, args.streams, args)
    show("high", high)
    # period scales with the time scale, work does not: the scale at which low's slack = high's
    scale = (high["slack_ms"] + low["work_p50_ms"]) / low["period_ms"]
    if scale <= 0:
        print("equal: none: the high run has no slack (its work exceeds its period)")
        return {"low": low, "high": high}
    equal = run(sim_args, scale, args.low_streams, args)
    show("equal", equal)
    return {"low": low, "high": high, "equal": equal}


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} [{min(values):.3f}..{max(values):.3f}]"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=1024)
    parser.add_argument("--low-streams", type=int, default=32)
    parser.add_argument("--warmup-s", type=float, default=8.0)
    parser.add_argument("--measure-s", type=float, default=15.0)
    parser.add_argument("--repeats", type=int, default=1, help="each repeat measures low, high and equal")
    parser.add_argument("--client", help=argparse.SUPPRESS)
    parser.add_argument("--duration-s", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        asyncio.run(_client(args.client, args.streams, args.duration_s))
        return 0
    runs = []
    for i in range(args.repeats):
        print(f"repeat {i + 1} of {args.repeats}; load average {load()}", flush=True)
        runs.append(one_repeat(args))
    print(f"over {len(runs)} repeat(s), median [min..max]:")
    for name in ("low", "high", "equal"):
        rs = [r[name] for r in runs if name in r]
        if rs:
            print(f"  {name:>5}: " + "  ".join(f"{k} {spread([r[k] for r in rs])}" for k in
                  ("period_ms", "work_p50_ms", "work_p99_ms", "slack_ms", "lag_p50_ms", "lag_p99_ms")))  # fmt: skip
    high_low = [r["high"]["lag_p99_ms"] / max(r["low"]["lag_p99_ms"], 1e-6) for r in runs]
    print(f"lag p99 high/low (different slack) = {spread(high_low)}x")
    equal = [r["high"]["lag_p99_ms"] / max(r["equal"]["lag_p99_ms"], 1e-6) for r in runs if "equal" in r]
    if equal:
        print(f"lag p99 high/equal (same slack)    = {spread(equal)}x")
    p99 = [r["high"]["lag_p99_ms"] for r in runs]
    verdict = "PASS" if statistics.median(p99) < 2.0 else "FAIL"
    print(
        f"lag p99 at {args.streams} streams {spread(p99)} ms < 2 ms: {verdict}; load average {load()} (2 shared cores)"
    )
    return 0


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


if __name__ == "__main__":
    raise SystemExit(main())
