"""bench/cache_routing.py's figures: one round's summary, and the side-by-side report with the
issue's goals (each topology against the same policy's one process, paired within a round)."""

from __future__ import annotations

import statistics
from typing import Any

HITS, QUERIES = "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"
FINISHED = "vllm:request_success_total"
TOPOLOGIES = {"1": "1 process", "w4": "--workers 4", "p2": "2 processes"}
GOALS = {"hit_ratio": 0.97, "ttft_ratio": 1.1, "hot_max_over_mean": 1.15}  # issue 38
SCALING = ("cache_aware", "kv_events")  # the policies that claim to scale out: the goals are theirs


def summarize_round(
    name: str,
    hot_share: float,
    measure_s: float,
    ttft_s: list[float],
    num_tokens: int,
    num_errors: int,
    before: list[dict[str, float]],
    after: list[dict[str, float]],
) -> dict[str, Any]:
    def delta(metric: str) -> list[float]:
        return [a.get(metric, 0.0) - b.get(metric, 0.0) for a, b in zip(after, before, strict=True)]

    queries, hits, finished = sum(delta(QUERIES)), sum(delta(HITS)), delta(FINISHED)
    ttft = sorted(ttft_s)
    mean_finished = statistics.fmean(finished) if finished else 0.0
    return {
        "pool": name,
        "hot_share": hot_share,
        "hit_rate": hits / queries if queries else 0.0,
        "ttft_p50_ms": 1000 * _pct(ttft, 0.5),
        "ttft_p90_ms": 1000 * _pct(ttft, 0.9),
        "output_tps": num_tokens / measure_s,
        "requests_per_backend": finished,
        "max_over_mean": max(finished) / mean_finished if mean_finished else float("nan"),
        "errors": num_errors,
    }


def _pct(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def spread(values: list[float], fmt: str = "{:.3f}") -> str:
    if not values:
        return "-"
    mid = statistics.median(values)
    return f"{fmt.format(mid)} ({fmt.format(min(values))}..{fmt.format(max(values))})"


def pool_name(policy: str, topology: str) -> str:
    return f"{policy} {TOPOLOGIES[topology]}"


def report(results: list[dict[str, Any]], hot_share: float, policies: list[str], topologies: list[str]) -> list[str]:
    """Print one workload's table and ratios; the goals not met (cache_aware's)."""
    rows = [r for r in results if r["hot_share"] == hot_share]
    rounds = len({r["round"] for r in rows})
    title = "uniform" if hot_share == 0 else f"one prefix takes {hot_share:.0%} of the requests"
    print(f"\n== {title} (median (min..max) over {rounds} rounds)")
    print(
        f"{'pool':>34} {'hit rate':>22} {'TTFT p50 ms':>22} {'TTFT p90 ms':>22} {'out tok/s':>18} {'max/mean req':>20}"
    )
    for policy in policies:
        for topology in topologies:
            mine = [r for r in rows if r["pool"] == pool_name(policy, topology)]
            print(
                f"{pool_name(policy, topology):>34} {spread([r['hit_rate'] for r in mine]):>22} "
                f"{spread([r['ttft_p50_ms'] for r in mine], '{:.1f}'):>22} "
                f"{spread([r['ttft_p90_ms'] for r in mine], '{:.1f}'):>22} "
                f"{spread([r['output_tps'] for r in mine], '{:.0f}'):>18} "
                f"{spread([r['max_over_mean'] for r in mine], '{:.2f}'):>20}"
            )
    missed = []
    for policy in policies:
        for topology in topologies[1:]:
            ratios = paired(rows, pool_name(policy, topology), pool_name(policy, topologies[0]))
            print(
                f"{pool_name(policy, topology)} / {TOPOLOGIES[topologies[0]]}, paired per round: "
                f"hit rate {spread(ratios['hit'])}x, TTFT p50 {spread(ratios['ttft'])}x"
            )
            if policy not in SCALING or not ratios["hit"]:
                continue
            checks = [("hit_ratio", statistics.median(ratios["hit"]), ">=")]
            checks.append(("ttft_ratio", statistics.median(ratios["ttft"]), "<="))
            missed += _check(f"{pool_name(policy, topology)}", checks)
    for ours, theirs in (("cache_aware", "cache_aware_local"), ("kv_events", "cache_aware")):
        if ours not in policies or theirs not in policies:
            continue
        for topology in topologies:
            ratios = paired(rows, pool_name(ours, topology), pool_name(theirs, topology))
            spreads = paired_spread(rows, pool_name(ours, topology), pool_name(theirs, topology))
            print(
                f"{ours} / {theirs}, {TOPOLOGIES[topology]}, paired per round: hit rate {spread(ratios['hit'])}x, "
                f"TTFT p50 {spread(ratios['ttft'])}x, requests max/mean {spread(spreads, '{:+.2f}')} apart"
            )
    for policy in SCALING:
        if not hot_share or policy not in policies:
            continue
        for topology in topologies:
            spreads = [r["max_over_mean"] for r in rows if r["pool"] == pool_name(policy, topology)]
            if spreads:
                missed += _check(pool_name(policy, topology), [("hot_max_over_mean", statistics.median(spreads), "<=")])
    return missed


def paired_spread(rows: list[dict[str, Any]], name: str, base: str) -> list[float]:
    """Per round: this pool's requests max/mean less the other's (below 0: more even)."""
    by_round = {r["round"]: r for r in rows if r["pool"] == base}
    return [r["max_over_mean"] - by_round[r["round"]]["max_over_mean"] for r in rows
            if r["pool"] == name and r["round"] in by_round]  # fmt: skip


def paired(rows: list[dict[str, Any]], name: str, base: str) -> dict[str, list[float]]:
    by_round = {r["round"]: r for r in rows if r["pool"] == base}
    out: dict[str, list[float]] = {"hit": [], "ttft": []}
    for r in rows:
        b = by_round.get(r["round"])
        if r["pool"] != name or b is None:
            continue
        if b["hit_rate"]:
            out["hit"].append(r["hit_rate"] / b["hit_rate"])
        out["ttft"].append(r["ttft_p50_ms"] / b["ttft_p50_ms"])
    return out


def _check(name: str, checks: list[tuple[str, float, str]]) -> list[str]:
    missed = []
    for goal, value, op in checks:
        target = GOALS[goal]
        ok = value >= target if op == ">=" else value <= target
        print(f"  goal {goal} {op} {target} ({name}): {value:.3f} {'met' if ok else 'NOT MET'}")
        if not ok:
            missed.append(f"{name}: {goal} {value:.3f}")
    return missed
