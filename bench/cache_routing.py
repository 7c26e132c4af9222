"""Cache-aware routing across processes: one gateway process, `--workers 4`, and two gateway
processes on two ports fed alternately, side by side in one run, for each policy.

Three simulated engines with small KV caches (2,048 blocks of 16 tokens) behind each pool; 48
streams send chat requests whose system prompt is one of 48 shared prefixes of ~1,000 words (one
word = one token in the sim), then a short question of their own. Each (policy, topology) gets
its own gateway process(es) and three fresh engines, all running at once; after a warm-up (the
caches fill), rounds take turns between the pools (the order rotates), so that the load the rest
of the machine puts on it falls on all of them alike. A round measures the engines' prefix-cache
hit rate (vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total), TTFT p50/p90, output
TPS, and the requests each engine finished (max / mean). On the uniform workload, then (fresh
pools) with one prefix taking half the traffic. Ratios are paired within a round: each topology
against the same policy's one process, cache_aware against cache_aware_local, and kv_events against
cache_aware. The goals of issue 38 are checked for the policies that scale out (cache_aware,
kv_events; exit 1 when one is not met). kv_events' sims publish their KV-cache events ([sim]
kv_events_endpoint, with replay) and its gateways follow them; the other pools' sims publish none.

    .venv/bin/python -m bench.cache_routing [--rounds 3] [--policies cache_aware,cache_aware_local,kv_events]
        [--topologies 1,w4,p2] [--warmup-s 8] [--measure-s 8]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from backends.sim.testing import run_sim_process
from bench._cache_drive import KEY, MODEL, drive
from bench._cache_report import FINISHED, HITS, QUERIES, TOPOLOGIES, pool_name, report, summarize_round
from common.commands import zerogap_command
from common.net import free_port
from common.process_group import stop_process
from common.promtext import sum_samples, sums_by_name
from loadtest import Workload, parse_settings

REPO = Path(__file__).resolve().parent.parent
DECISIONS = "zerogap_route_decisions_total"


def scrape(urls: list[str]) -> list[dict[str, float]]:
    pages = []
    for url in urls:
        with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
            pages.append(sums_by_name(resp.read(), {HITS, QUERIES, FINISHED}))
    return pages


def decisions(gateway_urls: list[str]) -> dict[str, float]:
    """The routing decisions so far (one gateway's workers share their metrics; processes add up)."""
    total = dict.fromkeys(("affinity", "balance", "no_match"), 0.0)
    for url in gateway_urls:
        with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
            page = resp.read()
        for reason in total:
            total[reason] += sum_samples(page, DECISIONS, {"reason": reason}) or 0.0
    return total


def wait_ready(url: str, proc: subprocess.Popen[bytes], log: Path, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-10:])
            raise SystemExit(f"the gateway exited with {proc.returncode}:\n{tail}")
        try:
            with urllib.request.urlopen(url + "/ready", timeout=1) as resp:
                if resp.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"the gateway at {url} was not ready within {timeout_s} s")


def gateway_config(
    args: argparse.Namespace, path: Path, sim_urls: list[str], policy: str, events: list[tuple[int, int]]
) -> Path:
    """events: each sim's (publisher, replay) ports, for kv_events."""
    lines = [
        f'[server]\napi_key = "{KEY}"',
        f'[gateway]\nrouting = "{policy}"\nkey_store = "keys.db"\nload_scrape_interval_s = {args.scrape_s}',
        f"[gateway.cache_aware]\nload_factor = {args.load_factor}\nkey_blocks = {args.key_blocks}",
    ]
    for i, u in enumerate(sim_urls):
        lines.append(f'[[backends]]\nname = "sim{i}"\nurl = "{u}"\nmodel = "{MODEL}"')
        if policy == "kv_events":
            pub, replay = events[i]
            lines.append(f'kv_events_endpoint = "tcp://127.0.0.1:{pub}"\n'
                         f'kv_events_replay_endpoint = "tcp://127.0.0.1:{replay}"')  # fmt: skip
    path.write_text("\n".join(lines) + "\n")
    return path


def distinct_ports(n: int) -> list[int]:
    """n free ports, all different (each held while the next is picked)."""
    with ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in socks]


@dataclass
class Pool:
    """One (policy, topology): its gateway URL(s) and its three sims."""

    name: str
    gateway_urls: list[str]
    sim_urls: list[str]
    logs: list[Path]


@contextmanager
def start_pool(args: argparse.Namespace, tmp: Path, policy: str, topology: str) -> Iterator[Pool]:
    ports = distinct_ports(9)  # each sim's HTTP, publisher and replay ports, none handed out twice
    events = [(ports[3 + 2 * i], ports[4 + 2 * i]) for i in range(3)]
    with ExitStack() as stack:
        sims = []
        for i, (pub, replay) in enumerate(events):
            sim_cfg = tmp / f"sim-{policy}-{topology}-{i}.toml"
            publish = f'kv_events_endpoint = "tcp://*:{pub}"\nkv_events_replay_endpoint = "tcp://*:{replay}"\n'
            sim_cfg.write_text(
                f"[sim]\nkv_cache_blocks = {args.kv_blocks}\n" + (publish if policy == "kv_events" else "")
            )
            scale = str(args.time_scale)
            sim = run_sim_process("--time-scale", scale, model=MODEL, config=sim_cfg, port=ports[i])
            sims.append(stack.enter_context(sim))
        urls = [s.url for s in sims]
        config = gateway_config(args, tmp / f"gateway-{policy}-{topology}.toml", urls, policy, events)
        workers, processes = (4, 1) if topology == "w4" else (1, 2) if topology == "p2" else (1, 1)
        gateway_urls: list[str] = []
        logs: list[Path] = []
        for _ in range(processes):
            port = free_port()
            cmd = zerogap_command("gateway", "--config", str(config), "--port", str(port), "--workers", str(workers))
            log = tmp / f"gateway-{policy}-{topology}-{port}.log"
            with log.open("wb") as out:
                proc = subprocess.Popen(cmd, cwd=tmp, stdout=out, stderr=subprocess.STDOUT)
            logs.append(log)
            stack.callback(stop_process, proc)
            gateway_urls.append(f"http://127.0.0.1:{port}")
            wait_ready(gateway_urls[-1], proc, log)
        if workers > 1:
            time.sleep(args.workers_settle_s)  # the port answers once the first worker listens
        yield Pool(pool_name(policy, topology), gateway_urls, urls, logs)


def make_workload(args: argparse.Namespace, hot_share: float) -> Workload:
    workload = {
        "model": MODEL, "prefix_groups": args.groups, "prefix_tokens": args.prefix_words,
        "prefix_hot_share": hot_share, "prompt_tokens": args.input_words, "max_output_tokens": args.max_tokens,
    }  # fmt: skip
    settings = parse_settings(json.dumps({"workload": workload}))
    return Workload(settings, " ".join(["question"] * args.input_words), seed=args.seed)


def chat_urls(pool: Pool) -> list[str]:
    return [u + "/v1/chat/completions" for u in pool.gateway_urls]


def measure(pool: Pool, workload: Workload, args: argparse.Namespace, hot_share: float) -> dict[str, Any]:
    """One round on a pool: its streams ramp up, then args.measure_s is measured."""
    before: list[dict[str, float]] = []

    def at_start() -> None:
        before.extend(scrape(pool.sim_urls))

    w = asyncio.run(drive(chat_urls(pool), workload, args, args.round_warmup_s, args.measure_s, at_start))
    after = scrape(pool.sim_urls)
    result = summarize_round(pool.name, hot_share, args.measure_s, w.ttft_s, w.num_tokens, w.num_errors, before, after)
    result["decisions"] = decisions(pool.gateway_urls)
    return result


def run_phase(args: argparse.Namespace, hot_share: float, tmp: Path) -> list[dict[str, Any]]:
    """Every pool side by side: all up and warmed, then rounds in a rotating order."""
    workload = make_workload(args, hot_share)
    results = []
    with ExitStack() as stack:
        pools = [
            stack.enter_context(start_pool(args, tmp, policy, topology))
            for policy in args.policies
            for topology in args.topologies
        ]
        for pool in pools:
            asyncio.run(drive(chat_urls(pool), workload, args, args.warmup_s, 0.0, lambda: None))
        for n in range(args.rounds):
            k = n % len(pools)
            for pool in pools[k:] + pools[:k]:
                r = measure(pool, workload, args, hot_share)
                r["round"] = n
                results.append(r)
                print(
                    f"  [{n + 1}/{args.rounds}] hot {hot_share:.2f} {pool.name:>32}: hit {r['hit_rate']:.3f} "
                    f"TTFT p50 {r['ttft_p50_ms']:.1f} p90 {r['ttft_p90_ms']:.1f} ms, {r['output_tps']:.0f} tok/s, "
                    f"requests {[int(x) for x in r['requests_per_backend']]} errors {r['errors']} "
                    f"decisions so far { ({k: int(v) for k, v in r['decisions'].items() if v}) }",
                    flush=True,
                )
                if r["errors"]:
                    for log in pool.logs:  # what the gateway said about it
                        print(f"    {log.name}: " + "\n    ".join(log.read_text(errors="replace").splitlines()[-5:]))
    return results


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3, help="measured rounds per pool and workload")
    p.add_argument(
        "--policies", default="cache_aware,cache_aware_local,kv_events", help="routing policies, comma-separated"
    )
    p.add_argument("--topologies", default="1,w4,p2", help="1 (one process), w4 (--workers 4), p2 (two processes)")
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
    p.add_argument("--scrape-s", type=float, default=0.5, help="[gateway].load_scrape_interval_s")
    p.add_argument("--load-factor", type=float, default=1.15, help="[gateway.cache_aware].load_factor")
    p.add_argument("--key-blocks", type=int, default=16, help="[gateway.cache_aware].key_blocks")
    p.add_argument("--workers-settle-s", type=float, default=3.0, help="after a --workers gateway answers")
    p.add_argument("--json", type=Path, default=None, help="also write every round's figures here")
    args = p.parse_args()
    args.policies = args.policies.split(",")
    args.topologies = args.topologies.split(",")
    unknown = set(args.topologies) - set(TOPOLOGIES)
    if unknown:
        p.error(f"unknown topologies {sorted(unknown)}; of {sorted(TOPOLOGIES)}")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the sims and the gateways on the way out
    print(
        f"cache routing: 3 sims x {args.kv_blocks} KV blocks (time scale {args.time_scale:g}), {args.streams} streams, "
        f"{args.groups} prefixes of {args.prefix_words} words + {args.input_words}, {args.max_tokens} tokens out; "
        f"{args.rounds} rounds of {args.round_warmup_s:g}+{args.measure_s:g} s per pool after {args.warmup_s:g} s "
        f"of warm-up; {os.cpu_count()} CPUs, load average at the start {_load()}",
        flush=True,
    )
    results = []
    with tempfile.TemporaryDirectory(prefix="zerogap-cache-bench-") as tmp:
        for hot_share in (0.0, args.hot_share):
            results += run_phase(args, hot_share, Path(tmp))
            print(f"  load average after the phase: {_load()}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    missed = []
    for hot_share in (0.0, args.hot_share):
        missed += report(results, hot_share, args.policies, args.topologies)
    print(f"load average at the end: {_load()} ({os.cpu_count()} CPUs, shared with whatever else runs)")
    if missed:
        print("goals NOT met: " + "; ".join(missed))
        sys.exit(1)


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


if __name__ == "__main__":
    main()
