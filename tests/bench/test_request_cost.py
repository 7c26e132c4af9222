"""bench/gateway_overhead.py's per-request cost (issue 36, no timing): the `request` and `cost`
modes, the CPU per request from the answers that ended in the window, and the goal lines
against the routers of the same run."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from bench import gateway_overhead
from bench._report import figures, goal_lines, report
from tests.bench.test_gateway_overhead import a_round


def with_rps(r: dict[str, Any], rps: float) -> dict[str, Any]:
    return {**r, "rps": rps}


def cost_rounds(gateway_ttft_ms: float, gateway_cpu: float) -> list[dict[str, Any]]:
    out = []
    for n in (1, 2, 3):
        out += [
            with_rps(a_round("direct", n, 50.0, 0.1), 1000.0),
            with_rps(a_round("gateway", n, gateway_ttft_ms, gateway_cpu), 1000.0),
            with_rps(a_round("tenant", n, gateway_ttft_ms, gateway_cpu), 1000.0),
            with_rps(a_round("vllm-router", n, 51.0, 0.2), 1000.0),
            with_rps(a_round("sglang-router", n, 51.5, 0.25), 1000.0),
        ]
    return out


def test_cpu_per_request_is_the_process_cpu_over_the_answers_that_ended() -> None:
    f = figures(cost_rounds(51.0, 0.3))
    assert f["gateway.cpu_us_per_request"] == pytest.approx([300.0] * 3)  # 0.3 of a core at 1,000 answers/s
    assert f["vllm-router.cpu_us_per_request"] == pytest.approx([200.0] * 3)
    no_count = figures([a_round("gateway", 1, 51.0, 0.3)])  # rounds from before the count: no figure
    assert no_count["gateway.cpu_us_per_request"][0] != no_count["gateway.cpu_us_per_request"][0]


def test_the_goal_lines_hold_each_gateway_target_against_the_best_router() -> None:
    fixed = goal_lines(figures(cost_rounds(50.9, 0.19)), "fixed")
    assert [line.rsplit(" ", 1)[1] for line in fixed] == ["PASS"] * 6  # gateway and tenant: p50, p99, CPU per token
    assert "gateway TTFT p50: +0.90 ms vs the best router's +1.00 ms: PASS" in fixed
    slow = goal_lines(figures(cost_rounds(51.2, 0.21)), "fixed")
    assert "gateway TTFT p50: +1.20 ms vs the best router's +1.00 ms: FAIL" in slow
    assert "gateway CPU per token: 42.0 us vs the best router's 40.0 us: FAIL" in slow
    assert "gateway TTFT p99: +1.20 ms, bound +2.50 ms: PASS" in slow  # max(2.5 ms, the best router's + 1 ms)
    request = goal_lines(figures(cost_rounds(51.0, 0.21)), "request")
    assert request == [
        "gateway CPU per request: 210 us vs vllm-router's 200 us: FAIL",
        "tenant CPU per request: 210 us vs vllm-router's 200 us: FAIL",
    ]
    no_router = [r for r in cost_rounds(51.0, 0.19) if "router" not in r["kind"]]
    assert goal_lines(figures(no_router), "fixed") == []


def test_the_report_carries_the_goal_verdicts_and_the_cpu_per_request(capsys: pytest.CaptureFixture[str]) -> None:
    summary = report(cost_rounds(51.2, 0.19), "request", "0.1 0.1 0.1")
    out = capsys.readouterr().out
    assert summary["issue36.gateway_CPU_per_request.verdict"] == "PASS"
    assert summary["gateway.cpu_us_per_request"].startswith("190 [190..190]")
    assert "| gateway | 1.000 | +1.20 ms | +1.20 ms | 38.0 µs | 190 µs |" in out


def test_cost_runs_fixed_then_request_with_its_own_streams(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[dict[str, float]] = []

    def run_mode(mode: str, args: argparse.Namespace, env: dict[str, str], peers: dict[str, str]) -> dict[str, Any]:
        seen.append({"mode": mode, **gateway_overhead.timing(mode, args)})  # type: ignore[dict-item]
        return {"mode": mode, "timing": {}, "rounds": cost_rounds(50.9, 0.19)}

    monkeypatch.setattr(gateway_overhead, "run_mode", run_mode)
    argv = ["--mode", "cost", "--peers", "none", "--num-tokens", "32", "--round-s", "3"]
    assert gateway_overhead.main(argv) == 0
    assert [s["mode"] for s in seen] == ["fixed", "request"]
    fixed, request = seen
    assert (fixed["num_tokens"], fixed["concurrency"], fixed["round_s"]) == (32, 256, 3)
    assert (request["num_tokens"], request["tokens_spread"], request["concurrency"], request["round_s"]) == (
        4,
        0,
        128,
        3,
    )
