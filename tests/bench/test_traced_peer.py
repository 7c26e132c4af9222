"""bench/gateway_overhead.py's traced target (issue 41), no timing: its config turns tracing on at
the ratio asked, its figures are held against the untraced gateway within each round, and its
verdict says so."""

from __future__ import annotations

import argparse
from typing import Any

from bench import gateway_overhead
from bench._report import figures, verdict
from common.config import load_config


def a_round(kind: str, n: int, ttft_ms: float, cpu: float) -> dict[str, Any]:
    process = {"direct": "upstream"}.get(kind, kind)
    return {"kind": kind, "round": n, "tps": 5000.0, "ttft_s": [ttft_ms / 1000] * 9, "num_errors": 0,
            "cpu": {"upstream": 0.1, "loadgen": 0.2, process: cpu}}  # fmt: skip


def test_the_traced_target_is_held_against_the_untraced_gateway() -> None:
    rounds = [r for n in (1, 2, 3) for r in (a_round("direct", n, 50.0, 0.1), a_round("gateway", n, 51.0, 0.25),
                                              a_round("traced", n, 51.1, 0.26))]  # fmt: skip
    f = figures(rounds)
    assert [round(x, 3) for x in f["traced_vs_gateway.cpu_per_token_ratio"]] == [1.04] * 3
    line = verdict(f, "traced", "gateway")
    assert line is not None and "traced vs the gateway untraced" in line and line.endswith(": PASS")
    too_costly = [dict(r, cpu={**r["cpu"], "traced": 0.27}) if r["kind"] == "traced" else r for r in rounds]
    assert verdict(figures(too_costly), "traced", "gateway").endswith(": FAIL")  # type: ignore[union-attr]


def test_its_config_turns_tracing_on_at_the_ratio_asked(tmp_path) -> None:
    path = gateway_overhead.gateway_config(tmp_path / "traced", 8000, 8100, trace_url="http://127.0.0.1:9", ratio=0.1)
    config = load_config(path, env={"TAOTOKEN_API_KEY": "bench-unified-key"})
    assert config.observability.otlp_endpoint == "http://127.0.0.1:9" and config.observability.sample_ratio == 0.1
    plain = gateway_overhead.gateway_config(tmp_path / "gateway", 8000, 8100)
    assert not load_config(plain, env={"TAOTOKEN_API_KEY": "bench-unified-key"}).observability.enabled
    args = argparse.Namespace(peers="traced", no_nginx=False)
    assert gateway_overhead.choose_peers(args) == {"traced": "traced"}
