"""Cache-aware routing against least_load and round_robin, side by side in one run.

Three simulated engines with small KV caches (2,048 blocks of 16 tokens) behind the
gateway; 48 streams send chat requests whose system prompt is one of 48 shared prefixes
of ~1,000 words (one word = one token in the sim), then a short question of their own.
Each policy gets its own gateway and three fresh engines, all running at once; after a
warm-up (the caches fill), rounds take turns between the policies (the order rotates), so
that the load the rest of the machine puts on it falls on all three alike. A round measures
the engines' prefix-cache hit rate (vllm:prefix_cache_hits_total /
vllm:prefix_cache_queries_total), TTFT p50/p90, output TPS, and the requests each engine
finished (max / mean). On the uniform workload, then (fresh pools) with one prefix taking
half the traffic; the ratios to least_load are paired within a round.

    .venv/bin/python -m bench.cache_routing [--rounds 5] [--warmup-s 8] [--measure-s 8]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from backends.sim.testing import run_sim_process
from loadtest import Workload, parse_settings
from zerogap.commands import zerogap_command
from zerogap.config.routing import CacheAwareSection
from zerogap.net import free_port
from zerogap.process_group import stop_process
from zerogap.promtext import sum_samples, sums_by_name

REPO = Path(__file__).resolve().parent.parent
POLICIES = ("least_load", "round_robin", "cache_aware")
KEY = "bench-unified-key"
MODEL = "sim-model"
HITS, QUERIES = "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"
FINISHED = "vllm:request_success_total"
DECISIONS = "zerogap_route_decisions_total"
TOKEN = re.compile(rb'"content":"[^"]')  # a chunk with text (the chat stream opens with an empty one)


@dataclass
class Window:
    start_s: float
    end_s: float
    ttft_s: list[float] = field(default_factory=list)
    num_tokens: int = 0
    num_errors: int = 0

    def inside(self, t: float) -> bool:
        return self.start_s <= t < self.end_s


async def one_request(session: aiohttp.ClientSession, url: str, body: bytes, w: Window) -> int:
    """Stream one answer; its completion tokens (from usage), counted when it ends in the window."""
    start = time.monotonic()
    first, tail = True, b""
    async with session.post(url, data=body) as resp:
        if resp.status != 200:
            w.num_errors += 1
            await resp.read()
            return 0
        async for data in resp.content.iter_any():
            if first and TOKEN.search(data):
                first = False
                if w.inside(start):
                    w.ttft_s.append(time.monotonic() - start)
            tail = (tail + data)[-4096:]
    tokens = _completion_tokens(tail)
    if w.inside(time.monotonic()):
        w.num_tokens += tokens
    return tokens


def _completion_tokens(tail: bytes) -> int:
    for line in reversed(tail.split(b"\n")):
        if line.startswith(b"data: {") and b'"usage"' in line:
            usage = json.loads(line[6:]).get("usage") or {}
            return int(usage.get("completion_tokens") or 0)
    return 0


async def stream_loop(session: aiohttp.ClientSession, url: str, workload: Workload, w: Window, delay_s: float) -> None:
    user = workload.session()
    await asyncio.sleep(delay_s)
    while time.monotonic() < w.end_s:
        try:
            user.answered(await one_request(session, url, user.body(MODEL), w))
        except (aiohttp.ClientError, OSError):
            w.num_errors += 1
            await asyncio.sleep(0.05)


async def drive(
    url: str,
    workload: Workload,
    args: argparse.Namespace,
    warmup_s: float,
    measure_s: float,
    at_start: Callable[[], Any],
) -> Window:
    """args.streams streams for warmup_s, then measure_s measured (at_start runs in between)."""
    now = time.monotonic()
    w = Window(now + warmup_s, now + warmup_s + measure_s)
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    timeout = aiohttp.ClientTimeout(total=warmup_s + measure_s + 60)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), headers=headers, timeout=timeout) as s:
        tasks = [
            asyncio.ensure_future(stream_loop(s, url, workload, w, i * args.spread_s / args.streams))
            for i in range(args.streams)
        ]
        await asyncio.sleep(max(0.0, w.start_s - time.monotonic()))
        await asyncio.to_thread(at_start)
        await asyncio.wait(tasks, timeout=warmup_s + measure_s + 60)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return w


def scrape(urls: list[str]) -> list[dict[str, float]]:
    pages = []
    for url in urls:
        with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
            pages.append(sums_by_name(resp.read(), {HITS, QUERIES, FINISHED}))
    return pages


def decisions(gateway_url: str) -> dict[str, float]:
    with urllib.request.urlopen(gateway_url + "/metrics", timeout=5) as resp:
        page = resp.read()
    return {r: sum_samples(page, DECISIONS, {"reason": r}) or 0.0 for r in ("affinity", "balance", "no_match")}


def wait_ready(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the gateway exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/ready", timeout=1) as resp:
                if resp.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"the gateway at {url} was not ready within {timeout_s} s")


def gateway_config(args: argparse.Namespace, tmp: Path, port: int, sim_urls: list[str], policy: str) -> Path:
    lines = [
        f'[server]\nport = {port}\napi_key = "{KEY}"\nbase_url = "http://127.0.0.1:{port}/api"',
        f'[gateway]\nrouting = "{policy}"\nkey_store = "keys.db"\nload_scrape_interval_s = 0.5',
        f"[gateway.cache_aware]\nbalance_abs = {args.balance_abs}\nbalance_rel = {args.balance_rel}",
    ]
    lines += [f'[[backends]]\nname = "sim{i}"\nurl = "{u}"\nmodel = "{MODEL}"' for i, u in enumerate(sim_urls)]
    path = tmp / f"gateway-{policy}.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


@dataclass
class Pool:
    """One policy's gateway and its three sims."""

    policy: str
    gateway_url: str
    sim_urls: list[str]


@contextmanager
def start_pool(args: argparse.Namespace, tmp: Path, policy: str) -> Iterator[Pool]:
    sim_cfg = tmp / "sim.toml"
    sim_cfg.write_text(f"[sim]\nkv_cache_blocks = {args.kv_blocks}\n")
    with ExitStack() as stack:
        sims = [
            stack.enter_context(run_sim_process("--time-scale", str(args.time_scale), model=MODEL, config=sim_cfg))
            for _ in range(3)
        ]
        urls = [s.url for s in sims]
        port = free_port()
        config = gateway_config(args, tmp, port, urls, policy)
        cmd = zerogap_command("gateway", "--config", str(config))
        gateway = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        stack.callback(stop_process, gateway)
        gateway_url = f"http://127.0.0.1:{port}"
        wait_ready(gateway_url, gateway)
        yield Pool(policy, gateway_url, urls)


def make_workload(args: argparse.Namespace, hot_share: float) -> Workload:
    workload = {
        "model": MODEL, "prefix_groups": args.groups, "prefix_tokens": args.prefix_words,
        "prefix_hot_share": hot_share, "prompt_tokens": args.input_words, "max_output_tokens": args.max_tokens,
    }  # fmt: skip
    settings = parse_settings(json.dumps({"workload": workload}))
    return Workload(settings, " ".join(["question"] * args.input_words), seed=args.seed)


def measure(pool: Pool, workload: Workload, args: argparse.Namespace, hot_share: float) -> dict[str, Any]:
    """One round on a pool: its streams ramp up, then args.measure_s is measured."""
    before: list[dict[str, float]] = []

    def at_start() -> None:
        before.extend(scrape(pool.sim_urls))

    url = pool.gateway_url + "/v1/chat/completions"
    w = asyncio.run(drive(url, workload, args, args.round_warmup_s, args.measure_s, at_start))
    result = summarize_round(pool.policy, hot_share, args.measure_s, w, before, scrape(pool.sim_urls))
    result["decisions"] = decisions(pool.gateway_url)
    return result


def run_phase(args: argparse.Namespace, hot_share: float, tmp: Path) -> list[dict[str, Any]]:
    """The three policies side by side: all pools up and warmed, then rounds in a rotating order."""
    workload = make_workload(args, hot_share)
    results = []
    with ExitStack() as stack:
        pools = [stack.enter_context(start_pool(args, tmp, policy)) for policy in POLICIES]
        for pool in pools:
            asyncio.run(
                drive(pool.gateway_url + "/v1/chat/completions", workload, args, args.warmup_s, 0.0, lambda: None)
            )
        for n in range(args.rounds):
            for pool in pools[n % 3 :] + pools[: n % 3]:
                r = measure(pool, workload, args, hot_share)
                r["round"] = n
                results.append(r)
                print(
                    f"  [{n + 1}/{args.rounds}] hot {hot_share:.2f} {pool.policy:>12}: hit {r['hit_rate']:.3f} "
                    f"TTFT p50 {r['ttft_p50_ms']:.1f} p90 {r['ttft_p90_ms']:.1f} ms, {r['output_tps']:.0f} tok/s, "
                    f"requests {[int(x) for x in r['requests_per_backend']]} errors {r['errors']} "
                    f"decisions so far { ({k: int(v) for k, v in r['decisions'].items() if v}) }",
                    flush=True,
                )
    return results


def summarize_round(
    policy: str,
    hot_share: float,
    measure_s: float,
    w: Window,
    before: list[dict[str, float]],
    after: list[dict[str, float]],
) -> dict[str, Any]:
    def delta(name: str) -> list[float]:
        return [a.get(name, 0.0) - b.get(name, 0.0) for a, b in zip(after, before, strict=True)]

    queries, hits, finished = sum(delta(QUERIES)), sum(delta(HITS)), delta(FINISHED)
    ttft = sorted(w.ttft_s)
    mean_finished = statistics.fmean(finished) if finished else 0.0
    return {
        "policy": policy,
        "hot_share": hot_share,
        "hit_rate": hits / queries if queries else 0.0,
        "ttft_p50_ms": 1000 * _pct(ttft, 0.5),
        "ttft_p90_ms": 1000 * _pct(ttft, 0.9),
        "output_tps": w.num_tokens / measure_s,
        "requests_per_backend": finished,
        "max_over_mean": max(finished) / mean_finished if mean_finished else float("nan"),
        "errors": w.num_errors,
    }


def _pct(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def spread(values: list[float], fmt: str = "{:.2f}") -> str:
    if not values:
        return "-"
    mid = statistics.median(values)
    return f"{fmt.format(mid)} ({fmt.format(min(values))}..{fmt.format(max(values))})"


TARGETS_UNIFORM = {"hit_rate": 0.85, "hit_ratio": 1.3, "ttft_ratio": 0.8, "tps_ratio": 0.97, "max_over_mean": 1.3}


def report(results: list[dict[str, Any]], hot_share: float, rounds: int) -> None:
    rows = sorted((r for r in results if r["hot_share"] == hot_share), key=lambda r: r["round"])
    title = "uniform" if hot_share == 0 else f"one prefix takes {hot_share:.0%} of the requests"
    print(f"\n== {title} (median (min..max) over {rounds} rounds per policy)")
    print(
        f"{'policy':>12} {'hit rate':>18} {'TTFT p50 ms':>22} {'TTFT p90 ms':>22} "
        f"{'out tok/s':>22} {'max/mean req':>18}"
    )
    for policy in POLICIES:
        mine = [r for r in rows if r["policy"] == policy]
        print(
            f"{policy:>12} {spread([r['hit_rate'] for r in mine]):>18} "
            f"{spread([r['ttft_p50_ms'] for r in mine], '{:.1f}'):>22} "
            f"{spread([r['ttft_p90_ms'] for r in mine], '{:.1f}'):>22} "
            f"{spread([r['output_tps'] for r in mine], '{:.0f}'):>22} {spread([r['max_over_mean'] for r in mine]):>18}"
        )
    base = [r for r in rows if r["policy"] == "least_load"]
    cache = [r for r in rows if r["policy"] == "cache_aware"]
    pairs = list(zip(base, cache, strict=True))
    ratios = {
        "hit_ratio": [c["hit_rate"] / b["hit_rate"] for b, c in pairs if b["hit_rate"]],
        "ttft_ratio": [c["ttft_p50_ms"] / b["ttft_p50_ms"] for b, c in pairs],
        "tps_ratio": [c["output_tps"] / b["output_tps"] for b, c in pairs],
    }
    print(
        f"cache_aware / least_load, paired per round: hit rate {spread(ratios['hit_ratio'])}x, "
        f"TTFT p50 {spread(ratios['ttft_ratio'])}x, output TPS {spread(ratios['tps_ratio'], '{:.3f}')}x"
    )
    checks = {
        "hit_rate": ([r["hit_rate"] for r in cache], ">=", TARGETS_UNIFORM["hit_rate"]),
        "hit_ratio": (ratios["hit_ratio"], ">=", TARGETS_UNIFORM["hit_ratio"]),
        "ttft_ratio": (ratios["ttft_ratio"], "<=", TARGETS_UNIFORM["ttft_ratio"]),
        "tps_ratio": (ratios["tps_ratio"], ">=", TARGETS_UNIFORM["tps_ratio"]),
        "max_over_mean": ([r["max_over_mean"] for r in cache], "<=", TARGETS_UNIFORM["max_over_mean"]),
    }
    if hot_share:
        checks = {k: checks[k] for k in ("tps_ratio", "max_over_mean")}
    for name, (values, op, target) in checks.items():
        mid = statistics.median(values) if values else float("nan")
        ok = mid >= target if op == ">=" else mid <= target
        print(f"  target {name} {op} {target}: median {mid:.3f} {'met' if ok else 'NOT MET'}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=5, help="measured rounds per policy and workload")
    p.add_argument("--warmup-s", type=float, default=8.0, help="each pool's first warm-up (its caches fill)")
    p.add_argument("--round-warmup-s", type=float, default=2.0, help="the streams' ramp-up before each round")
    p.add_argument("--measure-s", type=float, default=8.0)
    p.add_argument("--streams", type=int, default=48)
    p.add_argument("--groups", type=int, default=48)
    p.add_argument("--prefix-words", type=int, default=1000)
    p.add_argument("--input-words", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--kv-blocks", type=int, default=2048)
    p.add_argument("--time-scale", type=float, default=2.0, help="the sims' time scale (slower = less CPU)")
    p.add_argument("--spread-s", type=float, default=1.0, help="the streams start spread over this")
    p.add_argument("--hot-share", type=float, default=0.5)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--balance-abs", type=float, default=CacheAwareSection().balance_abs)
    p.add_argument("--balance-rel", type=float, default=CacheAwareSection().balance_rel)
    p.add_argument("--json", type=Path, default=None, help="also write every round's figures here")
    args = p.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the sims and the gateway on the way out
    print(
        f"cache routing: 3 sims x {args.kv_blocks} KV blocks (time scale {args.time_scale:g}), {args.streams} streams, "
        f"{args.groups} prefixes of {args.prefix_words} words + {args.input_words}, {args.max_tokens} tokens out; "
        f"{args.rounds} rounds of {args.round_warmup_s:g}+{args.measure_s:g} s per policy "
        f"after {args.warmup_s:g} s of warm-up",
        flush=True,
    )
    results = []
    with tempfile.TemporaryDirectory(prefix="zerogap-cache-bench-") as tmp:
        for hot_share in (0.0, args.hot_share):
            results += run_phase(args, hot_share, Path(tmp))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    for hot_share in (0.0, args.hot_share):
        report(results, hot_share, args.rounds)
    print(f"load average at the end: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
