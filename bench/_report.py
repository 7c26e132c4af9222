"""The figures of bench/gateway_overhead.py from its rounds: each as the median over the
rounds with its [min..max]; differences and ratios are taken within a round (side by side),
then summarized over the rounds."""

from __future__ import annotations

import json
import os
import statistics
from typing import Any

RELAY_PROCESS = {
    k: k
    for k in ("gateway", "tenant", "tenant-redis", "traced", "nginx", "vllm-router", "sglang-router", "workers2",
              "nginx2", "baseline", "floor")
} | {"direct": "upstream"}  # fmt: skip
RELAYS = [k for k in RELAY_PROCESS if k != "direct"]
AT_LIMIT = 0.9  # share of one core (per process) from which a process counts as the bottleneck
NUM_PROCESSES = {"workers2": 2, "nginx2": 2}
TWO_WORKERS = {"workers2": "gateway", "nginx2": "nginx"}  # a relay with 2 worker processes, and its 1-worker self
# a gateway driven with a virtual key that has rpm, tpm and max_concurrency (limits in memory, or in Redis),
# and the gateway driven with the unified key (no limits) that it is held against
TENANTS = {"tenant": "gateway", "tenant-redis": "gateway"}
# issue 41: the gateway with traces on ([observability], --trace-ratio of the requests sampled) against it untraced
TRACED = {"traced": "gateway"}
HELD_AGAINST = {**TENANTS, **TRACED}  # each target with a verdict, and the target it is held against
AGAINST_WHAT = {"traced": "the gateway untraced"}
FLOOR = {"floor": "bench/_relay_floor.py"}  # issue 36: the least a relay in CPython does (a measuring stick)
GOAL_TTFT_MS = 0.2  # issue 35: what the tenant path may add to TTFT p50 over the unified key
GOAL_CPU_RATIO = 1.05  # and to the CPU per relayed token


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def spread(values: list[float], unit: str = "", digits: int = 2) -> str:
    """'median [min..max]unit' of values."""
    values = [v for v in values if v == v]  # a round without a sample (nan) has no say
    if not values:
        return "n/a"
    med, lo, hi = statistics.median(values), min(values), max(values)
    return f"{med:.{digits}f} [{lo:.{digits}f}..{hi:.{digits}f}]{unit}"


def per_round(rounds: list[dict[str, Any]]) -> dict[int, dict[str, dict[str, Any]]]:
    by: dict[int, dict[str, dict[str, Any]]] = {}
    for r in rounds:
        by.setdefault(r["round"], {})[r["kind"]] = r
    return by


def cpu_us_per_token(r: dict[str, Any], process: str) -> float:
    return 1e6 * r["cpu"][process] / r["tps"] if r["tps"] else float("nan")


def cpu_us_per_request(r: dict[str, Any], process: str) -> float:
    return 1e6 * r["cpu"][process] / r["rps"] if r.get("rps") else float("nan")


def figures(rounds: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Each figure's value per round."""
    out: dict[str, list[float]] = {}

    def add(name: str, value: float) -> None:
        out.setdefault(name, []).append(value)

    for kinds in per_round(rounds).values():
        for kind, r in kinds.items():
            add(f"{kind}.tps", r["tps"])
            add(f"{kind}.ttft_p50_ms", 1000 * pct(r["ttft_s"], 0.5))
            add(f"{kind}.ttft_p99_ms", 1000 * pct(r["ttft_s"], 0.99))
            add(f"{kind}.cpu_us_per_token", cpu_us_per_token(r, RELAY_PROCESS[kind]))
            add(f"{kind}.cpu_us_per_request", cpu_us_per_request(r, RELAY_PROCESS[kind]))
            add(f"{kind}.relay_cpu_share", r["cpu"][RELAY_PROCESS[kind]])
            add(f"{kind}.loadgen_cpu_share", r["cpu"]["loadgen"])
            add(f"{kind}.upstream_cpu_share", r["cpu"]["upstream"])
            add(f"{kind}.num_errors", r["num_errors"])
            if r.get("overhead_ms"):  # a gateway's own figure (x-zerogap-overhead-ms): its time before the head
                add(f"{kind}.overhead_p50_ms", pct(r["overhead_ms"], 0.5))
                add(f"{kind}.overhead_p99_ms", pct(r["overhead_ms"], 0.99))
        g, d, n = kinds.get("gateway"), kinds.get("direct"), kinds.get("nginx")
        for relay in RELAYS:
            if (rr := kinds.get(relay)) and d:
                add(f"{relay}_vs_direct.tps_ratio", rr["tps"] / d["tps"])
                add(f"{relay}_vs_direct.added_ttft_p50_ms", 1000 * (pct(rr["ttft_s"], 0.5) - pct(d["ttft_s"], 0.5)))
                add(f"{relay}_vs_direct.added_ttft_p99_ms", 1000 * (pct(rr["ttft_s"], 0.99) - pct(d["ttft_s"], 0.99)))
        if g and n:
            add("gateway_vs_nginx.tps_ratio", g["tps"] / n["tps"])
            add("gateway_vs_nginx.added_ttft_p50_ms", 1000 * (pct(g["ttft_s"], 0.5) - pct(n["ttft_s"], 0.5)))
            add("gateway_vs_nginx.cpu_per_token_ratio", cpu_us_per_token(g, "gateway") / cpu_us_per_token(n, "nginx"))
        for two, one in TWO_WORKERS.items():
            if (w := kinds.get(two)) and (o := kinds.get(one)):
                add(f"{two}_vs_{one}.tps_ratio", w["tps"] / o["tps"])
                add(f"{two}_vs_{one}.cpu_per_token_ratio", cpu_us_per_token(w, two) / cpu_us_per_token(o, one))
                shares = [v for k, v in w["cpu"].items() if k.startswith(f"{two}.w")]
                if shares and sum(shares) > 0:
                    add(f"{two}.busiest_worker_share", max(shares) / sum(shares))
        for tenant, unified in HELD_AGAINST.items():
            if (t := kinds.get(tenant)) and (u := kinds.get(unified)):
                key = f"{tenant}_vs_{unified}"
                add(f"{key}.added_ttft_p50_ms", 1000 * (pct(t["ttft_s"], 0.5) - pct(u["ttft_s"], 0.5)))
                add(f"{key}.added_ttft_p99_ms", 1000 * (pct(t["ttft_s"], 0.99) - pct(u["ttft_s"], 0.99)))
                add(f"{key}.cpu_per_token_ratio", cpu_us_per_token(t, tenant) / cpu_us_per_token(u, unified))
                if t.get("overhead_ms") and u.get("overhead_ms"):
                    add(f"{key}.added_overhead_p50_ms", pct(t["overhead_ms"], 0.5) - pct(u["overhead_ms"], 0.5))
        if (tr := kinds.get("tenant-redis")) and "redis" in tr["cpu"]:
            add("tenant-redis.redis_cpu_us_per_token", cpu_us_per_token(tr, "redis"))
        if (b := kinds.get("baseline")) and g:
            add(
                "gateway_vs_baseline.cpu_per_token_ratio",
                cpu_us_per_token(g, "gateway") / cpu_us_per_token(b, "baseline"),
            )
            add("gateway_vs_baseline.added_ttft_p50_ms", 1000 * (pct(g["ttft_s"], 0.5) - pct(b["ttft_s"], 0.5)))
    return out


def bottlenecks(f: dict[str, list[float]], kind: str) -> str:
    """Which process was at its limit in this target's rounds (median CPU share >= AT_LIMIT)."""
    names = {"relay": f"{kind}.relay_cpu_share", "load generator": f"{kind}.loadgen_cpu_share"}
    if kind != "direct":
        names["upstream"] = f"{kind}.upstream_cpu_share"
    limits = {"relay": AT_LIMIT * NUM_PROCESSES.get(kind, 1), "load generator": AT_LIMIT, "upstream": AT_LIMIT}
    full = [n for n, key in names.items() if statistics.median(f[key]) >= limits[n]]
    return ", ".join(full) if full else "none near a full core"


def report(rounds: list[dict[str, Any]], mode: str, load: str) -> dict[str, str]:
    f = figures(rounds)
    kinds = [k for k in RELAY_PROCESS if f"{k}.tps" in f]
    print(f"{mode}: median [min..max] over {len(f[f'{kinds[0]}.tps'])} rounds; CPU as share of one core")
    for k in kinds:
        print(
            f"  {k:<13} {spread(f[f'{k}.tps'], ' tok/s', 0)}  TTFT p50 {spread(f[f'{k}.ttft_p50_ms'], ' ms')}  "
            f"p99 {spread(f[f'{k}.ttft_p99_ms'], ' ms')}  {RELAY_PROCESS[k]} CPU {spread(f[f'{k}.relay_cpu_share'])}"
            f" = {spread(f[f'{k}.cpu_us_per_token'], ' us/token', 1)}"
            f" = {spread(f[f'{k}.cpu_us_per_request'], ' us/request', 0)}  load generator CPU "
            f"{spread(f[f'{k}.loadgen_cpu_share'])}  errors {sum(f[f'{k}.num_errors']):.0f}  "
            f"at its limit: {bottlenecks(f, k)}"
        )
    summary = {}
    for key in sorted(k for k in f if "_vs_" in k):
        unit = " ms" if key.endswith("_ms") else "x"
        summary[key] = spread(f[key], unit, 2 if unit == " ms" and "overhead" not in key else 3)
        print(f"  {key:<40} {summary[key]}")
    for two in TWO_WORKERS:
        if (key := f"{two}.busiest_worker_share") in f:
            summary[key] = spread(f[key], "", 2)
            print(f"  {key:<40} {summary[key]} (of the CPU)")
    for k in kinds:
        if (key := f"{k}.overhead_p50_ms") in f:
            summary[key] = spread(f[key], " ms", 3)
            summary[f"{k}.overhead_p99_ms"] = spread(f[f"{k}.overhead_p99_ms"], " ms", 3)
            print(f"  {key:<40} {summary[key]}, p99 {summary[f'{k}.overhead_p99_ms']} (the gateway's own time "
                  "before the head, x-zerogap-overhead-ms)")  # fmt: skip
    if (key := "tenant-redis.redis_cpu_us_per_token") in f:
        summary[key] = spread(f[key], " us", 1)
        print(f"  {key:<40} {summary[key]} (redis-server's own CPU, not in the gateway's figure)")
    for k in kinds:
        summary[f"{k}.cpu_us_per_token"] = spread(f[f"{k}.cpu_us_per_token"], " us", 1)
        summary[f"{k}.tps"] = spread(f[f"{k}.tps"], " tok/s", 0)
        if statistics.median(f[f"{k}.loadgen_cpu_share"]) >= AT_LIMIT:
            print(f"  NOTE: the load generator was at its limit in the {k} rounds: their tok/s is a floor")
    for k in kinds:
        summary[f"{k}.cpu_us_per_request"] = spread(f[f"{k}.cpu_us_per_request"], " us", 0)
    print_table(f, kinds)
    for goal in goal_lines(f, mode):
        summary[f"issue36.{goal.split(':')[0].replace(' ', '_')}.verdict"] = goal.rsplit(" ", 1)[1]
        print(f"  {goal}")
    if mode == "fixed":
        for tenant, unified in HELD_AGAINST.items():
            if (line := verdict(f, tenant, unified)) is not None:
                summary[f"{tenant}.verdict"] = line.rsplit(" ", 1)[1]
                print(f"  {line}")
        if any(k.endswith(".verdict") for k in summary) and starved(load):
            print(f"  NOTE: load average {load} on {os.cpu_count()} cores: the machine was starved, and the TTFT "
                  "figures are its run queue's as much as the relays'; run it again on a quieter machine")  # fmt: skip
    print(f"  load average at the end: {load}")
    print(json.dumps({"mode": mode, **summary}))
    return summary


def print_table(f: dict[str, list[float]], kinds: list[str]) -> None:
    """The relays side by side, vs direct: one row each, medians over the rounds."""
    rows = [k for k in kinds if k != "direct" and f"{k}_vs_direct.tps_ratio" in f]
    if not rows:
        return
    print("  | relay | TPS ratio | added TTFT p50 | added TTFT p99 | CPU per relayed token | CPU per request |")
    print("  | --- | --- | --- | --- | --- | --- |")
    for k in rows:
        med = {name: statistics.median(v for v in f[f"{k}{name}"] if v == v) for name in (
            "_vs_direct.tps_ratio", "_vs_direct.added_ttft_p50_ms", "_vs_direct.added_ttft_p99_ms",
            ".cpu_us_per_token")}  # fmt: skip
        print(
            f"  | {k} | {med['_vs_direct.tps_ratio']:.3f} | {med['_vs_direct.added_ttft_p50_ms']:+.2f} ms | "
            f"{med['_vs_direct.added_ttft_p99_ms']:+.2f} ms | {med['.cpu_us_per_token']:.1f} µs | "
            f"{median_of(f[f'{k}.cpu_us_per_request']):.0f} µs |"
        )


def median_of(values: list[float]) -> float:
    values = [v for v in values if v == v]
    return statistics.median(values) if values else float("nan")


ROUTER_NAMES = ("vllm-router", "sglang-router")
GOAL_P99_FLOOR_MS = 2.5  # issue 36: added TTFT p99 at most max(this, the best router's + GOAL_P99_OVER_MS)
GOAL_P99_OVER_MS = 1.0


def goal_lines(f: dict[str, list[float]], mode: str) -> list[str]:
    """Issue 36's goals, medians over the rounds, against the routers of this run: in `fixed`, each
    gateway target's added TTFT p50 at most the best router's, its p99 at most max(2.5 ms, the best
    router's + 1 ms), its CPU per token at most the best router's; in `request` (4-token answers),
    its CPU per request at most vllm-router's. None without a router in the run."""
    routers = [r for r in ROUTER_NAMES if f"{r}_vs_direct.added_ttft_p50_ms" in f]
    if not routers:
        return []
    gateways = [g for g in ("gateway", "tenant") if f"{g}_vs_direct.added_ttft_p50_ms" in f]
    lines = []
    for g in gateways:
        if mode == "request":
            if "vllm-router.cpu_us_per_request" not in f:
                continue
            mine, theirs = median_of(f[f"{g}.cpu_us_per_request"]), median_of(f["vllm-router.cpu_us_per_request"])
            shown = "PASS" if mine <= theirs else "FAIL"
            lines.append(f"{g} CPU per request: {mine:.0f} us vs vllm-router's {theirs:.0f} us: {shown}")
            continue
        p50 = median_of(f[f"{g}_vs_direct.added_ttft_p50_ms"])
        p99 = median_of(f[f"{g}_vs_direct.added_ttft_p99_ms"])
        cpu = median_of(f[f"{g}.cpu_us_per_token"])
        best_p50 = min(median_of(f[f"{r}_vs_direct.added_ttft_p50_ms"]) for r in routers)
        best_p99 = min(median_of(f[f"{r}_vs_direct.added_ttft_p99_ms"]) for r in routers)
        best_cpu = min(median_of(f[f"{r}.cpu_us_per_token"]) for r in routers)
        bound_p99 = max(GOAL_P99_FLOOR_MS, best_p99 + GOAL_P99_OVER_MS)
        lines.append(f"{g} TTFT p50: {p50:+.2f} ms vs the best router's {best_p50:+.2f} ms: "
                     f"{'PASS' if p50 <= best_p50 else 'FAIL'}")  # fmt: skip
        shown = "PASS" if p99 <= bound_p99 else "FAIL"
        lines.append(f"{g} TTFT p99: {p99:+.2f} ms, bound {bound_p99:+.2f} ms: {shown}")
        lines.append(f"{g} CPU per token: {cpu:.1f} us vs the best router's {best_cpu:.1f} us: "
                     f"{'PASS' if cpu <= best_cpu else 'FAIL'}")  # fmt: skip
    return lines


def verdict(f: dict[str, list[float]], tenant: str, unified: str) -> str | None:
    """The tenant target against issue 35's goal (the medians over the rounds): at most GOAL_TTFT_MS
    more TTFT p50 and GOAL_CPU_RATIO the CPU per token of the unified key, and no request refused
    or failed (a refusal is cheaper than a relay: the figures would not be admission's cost).
    None without both targets' rounds."""
    key = f"{tenant}_vs_{unified}"
    if f"{key}.cpu_per_token_ratio" not in f:
        return None
    ttft = statistics.median(f[f"{key}.added_ttft_p50_ms"])
    cpu = [v for v in f[f"{key}.cpu_per_token_ratio"] if v == v]
    ratio = statistics.median(cpu) if cpu else float("nan")
    num_errors = sum(f[f"{tenant}.num_errors"])
    ok = ttft <= GOAL_TTFT_MS and ratio <= GOAL_CPU_RATIO and num_errors == 0
    errors = f", {num_errors:.0f} requests refused or failed" if num_errors else ""
    own = f"{key}.added_overhead_p50_ms"
    inside = f" [the gateway's own time {statistics.median(f[own]):+.3f} ms]" if own in f else ""
    return (
        f"verdict {tenant} vs {AGAINST_WHAT.get(tenant, 'the unified key')}: TTFT p50 {ttft:+.2f} ms{inside} "
        f"(goal <= {GOAL_TTFT_MS} ms), CPU per token "
        f"{ratio:.3f}x (goal <= {GOAL_CPU_RATIO}x){errors}: {'PASS' if ok else 'FAIL'}"
    )


def starved(load: str) -> bool:
    """Whether the last minute's load average (the first of `load`) was above the machine's cores."""
    try:
        return float(load.split()[0]) > (os.cpu_count() or 1)
    except (ValueError, IndexError):
        return False
