"""What the gateway costs: the same upstream and the same load, direct and through the
gateway, alternated in one run. Prints the TPS ratio and the added TTFT p50/p99.

Three processes share the machine: the upstream (tests/fixtures/upstream.py, known timing),
the gateway (`zerogap gateway`), and the load generator (aiohttp, this file with --loadgen).
The upstream's timing is modest (default 10 tokens/s per stream, 32 tokens per request) so
that 256 streams do not saturate 2 cores by themselves; the streams start spread over one
request's length, and every round keeps `--concurrency` streams open.

It prints the figures over all rounds, the median over (direct, gateway) pairs, and the
figures over "calm" pairs: pairs in which neither round fell below 90 % of the TPS that the
upstream's timing allows. On a machine shared with other work the pooled p99 mostly measures
the other work; the per-round lines show which rounds were starved.

    .venv/bin/python -m bench.gateway_overhead [--concurrency 256] [--rounds 5] [--round-s 8]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from backends.process_group import stop_process
from zerogap.net import free_port

REPO = Path(__file__).resolve().parent.parent
KEY = "bench-unified-key"
TOKEN = b'":" t'  # each token is " tN" in the fixture's chunks


def wait_port(port: int, proc: subprocess.Popen[bytes], timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"a helper process exited with {proc.returncode} before port {port} opened")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"port {port} did not open within {timeout_s} s")


# ---------------------------------------------------------------- load generator (own process)


class Round:
    def __init__(self, warmup_s: float, measure_s: float) -> None:
        self.t0 = time.monotonic()
        self.measure_from = self.t0 + warmup_s
        self.measure_to = self.measure_from + measure_s
        self.num_tokens = 0
        self.num_tokens_all = 0
        self.ttft_s: list[float] = []
        self.num_errors = 0

    def in_window(self, t: float) -> bool:
        return self.measure_from <= t < self.measure_to


async def one_stream(session: aiohttp.ClientSession, url: str, body: bytes, r: Round) -> None:
    start = time.monotonic()
    first = True
    async with session.post(url, data=body, headers={"Authorization": f"Bearer {KEY}"}) as resp:
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
            num = data.count(TOKEN)
            r.num_tokens_all += num
            if r.in_window(now):
                r.num_tokens += num
            if now >= r.measure_to:
                return


async def worker(session: aiohttp.ClientSession, url: str, body: bytes, r: Round, delay_s: float) -> None:
    await asyncio.sleep(delay_s)  # streams start spread over one request's length, as real traffic does
    while time.monotonic() < r.measure_to:
        try:
            await one_stream(session, url, body, r)
        except (aiohttp.ClientError, OSError):
            r.num_errors += 1
            await asyncio.sleep(0.05)


async def run_round(
    url: str, concurrency: int, warmup_s: float, measure_s: float, max_tokens: int, spread_s: float
) -> dict[str, Any]:
    body = json.dumps(
        {"model": "bench", "prompt": "hello there", "stream": True, "max_tokens": max_tokens, "ignore_eos": True}
    ).encode()
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    headers = {"Content-Type": "application/json"}
    async with aiohttp.ClientSession(connector=connector, headers=headers) as session:
        r = Round(warmup_s, measure_s)
        tasks = [
            asyncio.ensure_future(worker(session, url, body, r, i * spread_s / concurrency)) for i in range(concurrency)
        ]
        await asyncio.wait(tasks, timeout=warmup_s + measure_s + 30)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return {
        "tps": r.num_tokens / measure_s,
        "ttft_s": r.ttft_s,
        "num_errors": r.num_errors,
        "num_tokens_all": r.num_tokens_all,
    }


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux /proc)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def loadgen(args: argparse.Namespace) -> None:
    import uvloop

    pids = {"upstream": args.upstream_pid, "gateway": args.gateway_pid, "loadgen": os.getpid()}
    results = []
    for i in range(args.rounds * 2):
        kind = ("direct", "gateway")[i % 2]
        url = (args.direct if kind == "direct" else args.gateway) + "/v1/completions"
        before = {k: cpu_s(p) for k, p in pids.items()}
        t0 = time.monotonic()
        spread_s = args.ttft_s + args.max_tokens * args.interval_s
        res = uvloop.run(run_round(url, args.concurrency, args.warmup_s, args.round_s, args.max_tokens, spread_s))
        wall_s = time.monotonic() - t0
        cpu = {k: (cpu_s(p) - before[k]) / wall_s for k, p in pids.items()}
        res.update(kind=kind, cpu=cpu, wall_s=wall_s)
        results.append(res)
        shown = " ".join(f"{k}={v:.0%}" for k, v in cpu.items())
        p50_ms, p99_ms = 1000 * pct(res["ttft_s"], 0.5), 1000 * pct(res["ttft_s"], 0.99)
        print(
            f"  round {i + 1}: {kind:<8} {res['tps']:6.0f} tok/s  TTFT p50 {p50_ms:7.2f} ms p99 {p99_ms:8.2f} ms  "
            f"errors={res['num_errors']}  CPU of a core: {shown}",
            file=sys.stderr,
        )
    Path(args.out).write_text(json.dumps(results))


# ---------------------------------------------------------------- orchestration


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def calm_pairs(results: list[dict[str, Any]], expected_tps: float) -> dict[str, float]:
    """Pairs in which neither round fell below 90 % of the TPS the upstream's timing allows
    (a round below that was starved of CPU by something: other work on a shared machine, or
    the gateway itself; if the gateway causes it, no pair is calm and this says so)."""
    pairs = [(results[i], results[i + 1]) for i in range(0, len(results) - 1, 2)]
    calm = [(d, g) for d, g in pairs if min(d["tps"], g["tps"]) >= 0.9 * expected_tps]
    out: dict[str, float] = {"num_calm_pairs": len(calm), "expected_tps": expected_tps}
    if calm:
        d_ttft = [t for d, _ in calm for t in d["ttft_s"]]
        g_ttft = [t for _, g in calm for t in g["ttft_s"]]
        out["calm_tps_ratio"] = sum(g["tps"] for _, g in calm) / sum(d["tps"] for d, _ in calm)
        out["calm_added_ttft_p50_ms"] = 1000 * (pct(g_ttft, 0.5) - pct(d_ttft, 0.5))
        out["calm_added_ttft_p99_ms"] = 1000 * (pct(g_ttft, 0.99) - pct(d_ttft, 0.99))
    return out


def summarize(results: list[dict[str, Any]]) -> dict[str, float]:
    by = {k: [r for r in results if r["kind"] == k] for k in ("direct", "gateway")}
    ttft = {k: [t for r in rs for t in r["ttft_s"]] for k, rs in by.items()}
    tps = {k: statistics.mean(r["tps"] for r in rs) for k, rs in by.items()}
    pairs = list(zip(by["direct"], by["gateway"], strict=True))
    pair_ratios = [g["tps"] / d["tps"] for d, g in pairs if d["tps"]]
    pair_p50_ms = [1000 * (pct(g["ttft_s"], 0.5) - pct(d["ttft_s"], 0.5)) for d, g in pairs]
    pair_p99_ms = [1000 * (pct(g["ttft_s"], 0.99) - pct(d["ttft_s"], 0.99)) for d, g in pairs]
    gw_cpu_us = [1e6 * r["cpu"]["gateway"] * r["wall_s"] / max(1, r["num_tokens_all"]) for r in by["gateway"]]
    up_cpu_us = [1e6 * r["cpu"]["upstream"] * r["wall_s"] / max(1, r["num_tokens_all"]) for r in by["direct"]]
    return {
        "tps_direct": tps["direct"],
        "tps_gateway": tps["gateway"],
        "tps_ratio": tps["gateway"] / tps["direct"],
        "tps_ratio_median_of_pairs": statistics.median(pair_ratios),
        "ttft_p50_direct_ms": 1000 * pct(ttft["direct"], 0.5),
        "ttft_p50_gateway_ms": 1000 * pct(ttft["gateway"], 0.5),
        "ttft_p99_direct_ms": 1000 * pct(ttft["direct"], 0.99),
        "ttft_p99_gateway_ms": 1000 * pct(ttft["gateway"], 0.99),
        "added_ttft_p50_ms": 1000 * (pct(ttft["gateway"], 0.5) - pct(ttft["direct"], 0.5)),
        "added_ttft_p99_ms": 1000 * (pct(ttft["gateway"], 0.99) - pct(ttft["direct"], 0.99)),
        "added_ttft_p50_ms_median_of_pairs": statistics.median(pair_p50_ms),
        "added_ttft_p99_ms_median_of_pairs": statistics.median(pair_p99_ms),
        "gateway_cpu_us_per_token": statistics.median(gw_cpu_us),
        "upstream_cpu_us_per_token": statistics.median(up_cpu_us),
        "num_errors": sum(r["num_errors"] for r in results),
        "num_ttft_samples": min(len(v) for v in ttft.values()),
    }


def start(cmd: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL)


def orchestrate(args: argparse.Namespace) -> int:
    env = {**os.environ, "PYTHONPATH": str(REPO), "TAOTOKEN_API_KEY": KEY}
    up_port, gw_port = free_port(), free_port()
    upstream = start(
        [sys.executable, "-m", "tests.fixtures.upstream", "--port", str(up_port), "--model", "bench",
         "--ttft-s", str(args.ttft_s), "--interval-s", str(args.interval_s), "--num-output-tokens", "100000"],
        env,
    )  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "config.toml"
        config.write_text(
            f'[server]\nport = {gw_port}\napi_key = "${{TAOTOKEN_API_KEY}}"\n'
            f'base_url = "http://127.0.0.1:{gw_port}/api"\n[gateway]\nkey_store = "keys.db"\n'
            f'[logging]\nlevel = "warning"\n'
            f'[[backends]]\nname = "up"\nurl = "http://127.0.0.1:{up_port}"\nmodel = "bench"\n'
        )
        gateway = start([sys.executable, "-m", "zerogap", "gateway", "--config", str(config)], env)
        try:
            wait_port(up_port, upstream)
            wait_port(gw_port, gateway)
            time.sleep(1.0)
            return run_loadgen(args, env, (up_port, upstream.pid), (gw_port, gateway.pid))
        finally:
            stop_process(gateway)
            stop_process(upstream)


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def run_loadgen(args: argparse.Namespace, env: dict[str, str], up: tuple[int, int], gw: tuple[int, int]) -> int:
    (up_port, up_pid), (gw_port, gw_pid) = up, gw
    per_stream = 1 / args.interval_s
    print(
        f"gateway overhead: {args.concurrency} streams, upstream TTFT {args.ttft_s * 1000:.0f} ms, "
        f"{per_stream:.0f} tok/s per stream, {args.max_tokens} tokens per request, "
        f"{args.rounds} x (direct, gateway) rounds of {args.warmup_s:.0f}+{args.round_s:.0f} s; "
        f"{os.cpu_count()} cores, load average {load()}",
        file=sys.stderr,
    )
    cmd = [sys.executable, "-m", "bench.gateway_overhead", "--loadgen",
           "--direct", f"http://127.0.0.1:{up_port}", "--gateway", f"http://127.0.0.1:{gw_port}",
           "--concurrency", str(args.concurrency), "--rounds", str(args.rounds), "--round-s", str(args.round_s),
           "--warmup-s", str(args.warmup_s), "--max-tokens", str(args.max_tokens),
           "--upstream-pid", str(up_pid), "--gateway-pid", str(gw_pid),
           "--ttft-s", str(args.ttft_s), "--interval-s", str(args.interval_s)]  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rounds.json"
        subprocess.run([*cmd, "--out", str(out)], cwd=REPO, env=env, check=True)
        rounds = json.loads(out.read_text())
    s = summarize(rounds)
    request_s = args.ttft_s + args.max_tokens * args.interval_s
    s.update(calm_pairs(rounds, args.concurrency * args.max_tokens / request_s))
    print("all rounds pooled:")
    print(f"TPS direct {s['tps_direct']:.0f}, through gateway {s['tps_gateway']:.0f}: ratio {s['tps_ratio']:.3f}")
    print(
        f"TTFT p50 direct {s['ttft_p50_direct_ms']:.2f} ms, gateway {s['ttft_p50_gateway_ms']:.2f} ms: "
        f"added {s['added_ttft_p50_ms']:+.2f} ms"
    )
    print(
        f"TTFT p99 direct {s['ttft_p99_direct_ms']:.2f} ms, gateway {s['ttft_p99_gateway_ms']:.2f} ms: "
        f"added {s['added_ttft_p99_ms']:+.2f} ms"
    )
    print(
        f"median of the {args.rounds} (direct, gateway) pairs: TPS ratio {s['tps_ratio_median_of_pairs']:.3f}, "
        f"added TTFT p50 {s['added_ttft_p50_ms_median_of_pairs']:+.2f} ms, "
        f"p99 {s['added_ttft_p99_ms_median_of_pairs']:+.2f} ms"
    )
    print(
        "CPU per token relayed: "
        f"gateway {s['gateway_cpu_us_per_token']:.0f} us, upstream {s['upstream_cpu_us_per_token']:.0f} us"
    )
    print(f"errors {s['num_errors']}, TTFT samples per side >= {s['num_ttft_samples']}; load average {load()}")
    if s["num_calm_pairs"]:
        print(
            f"calm pairs ({s['num_calm_pairs']:.0f} of {args.rounds}, both rounds >= 90 % of the "
            f"{s['expected_tps']:.0f} tok/s the upstream allows): TPS ratio {s['calm_tps_ratio']:.3f}, "
            f"added TTFT p50 {s['calm_added_ttft_p50_ms']:+.2f} ms, p99 {s['calm_added_ttft_p99_ms']:+.2f} ms"
        )
    else:
        print(f"no calm pair: every pair had a round below 90 % of {s['expected_tps']:.0f} tok/s")
    print(json.dumps({k: round(v, 4) for k, v in s.items()}))
    return 0


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--concurrency", type=int, default=256)
    p.add_argument("--rounds", type=int, default=5, help="pairs of (direct, gateway) rounds")
    p.add_argument("--round-s", type=float, default=8.0, help="measured seconds per round")
    p.add_argument("--warmup-s", type=float, default=4.0, help="at least one request's length")
    p.add_argument("--ttft-s", type=float, default=0.05, help="upstream time to first token")
    p.add_argument("--interval-s", type=float, default=0.1, help="upstream time between tokens")
    p.add_argument("--max-tokens", type=int, default=32, help="tokens per request")
    p.add_argument("--loadgen", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--direct", help=argparse.SUPPRESS)
    p.add_argument("--gateway", help=argparse.SUPPRESS)
    p.add_argument("--upstream-pid", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--gateway-pid", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.loadgen:
        loadgen(args)
        return 0
    return orchestrate(args)


if __name__ == "__main__":
    raise SystemExit(main())
