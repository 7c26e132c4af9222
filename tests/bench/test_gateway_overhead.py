"""bench/gateway_overhead.py's own pieces (no timing): the tenant targets' peers, config and key,
the figures and the verdict against issue 35's goal, and the exit status that carries it."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import pytest

from bench import _loadgen as bench_loadgen
from bench import gateway_overhead
from bench._report import GOAL_CPU_RATIO, GOAL_TTFT_MS, figures, report, verdict
from common.config import load_config
from gateway.tenants.keys.sqlite import KeyStore

UNIFIED = "bench-unified-key"


def a_round(kind: str, n: int, ttft_ms: float, cpu: float, tps: float = 5000.0, errors: int = 0) -> dict[str, Any]:
    """One target's round: `cpu` is its process's share of a core (and redis-server's a tenth of it)."""
    process = {"direct": "upstream"}.get(kind, kind)
    shares = {"upstream": 0.1, "loadgen": 0.2, "redis": cpu / 10, process: cpu}
    overhead_ms = [] if kind == "direct" else [ttft_ms - 50.0] * 9  # a gateway's header: its own time
    return {"kind": kind, "round": n, "tps": tps, "ttft_s": [ttft_ms / 1000] * 9, "overhead_ms": overhead_ms,
            "num_errors": errors, "cpu": shares}  # fmt: skip


def rounds(tenant_ttft_ms: float, tenant_cpu: float, errors: int = 0, kind: str = "tenant") -> list[dict[str, Any]]:
    out = []
    for n in (1, 2, 3):
        out += [
            a_round("direct", n, 50.0, 0.1),
            a_round("gateway", n, 51.0 + n / 100, 0.25),
            a_round(kind, n, tenant_ttft_ms + n / 100, tenant_cpu, errors=errors),
        ]
    return out


def test_the_tenant_figures_are_taken_against_the_unified_key_within_each_round() -> None:
    f = figures(rounds(51.5, 0.26) + [a_round("tenant-redis", n, 52.0, 0.3) for n in (1, 2, 3)])
    assert f["tenant_vs_gateway.added_ttft_p50_ms"] == pytest.approx([0.5, 0.5, 0.5])
    assert f["tenant_vs_gateway.cpu_per_token_ratio"] == pytest.approx([1.04] * 3)
    assert f["tenant_vs_direct.added_ttft_p50_ms"] == pytest.approx([1.51, 1.52, 1.53])
    assert f["tenant-redis_vs_gateway.cpu_per_token_ratio"] == pytest.approx([1.2] * 3)
    assert f["tenant-redis.redis_cpu_us_per_token"] == pytest.approx([6.0] * 3)  # 0.03 of a core at 5,000 tok/s
    assert "tenant.redis_cpu_us_per_token" not in f
    assert f["tenant_vs_gateway.added_overhead_p50_ms"] == pytest.approx([0.5, 0.5, 0.5])  # x-zerogap-overhead-ms
    assert f["gateway.overhead_p50_ms"] == pytest.approx([1.01, 1.02, 1.03]) and "direct.overhead_p50_ms" not in f


def test_the_verdict_passes_within_the_goal_and_fails_past_either_bound() -> None:
    def line(ttft_ms: float, cpu: float, errors: int = 0) -> str:
        got = verdict(figures(rounds(ttft_ms, cpu, errors)), "tenant", "gateway")
        assert got is not None
        return got

    assert line(51.0 + GOAL_TTFT_MS - 0.05, 0.25 * GOAL_CPU_RATIO - 0.001).endswith(": PASS")
    too_slow = line(51.0 + GOAL_TTFT_MS + 0.05, 0.25)
    assert too_slow.endswith(": FAIL") and "TTFT p50 +0.25 ms [the gateway's own time +0.250 ms] (goal" in too_slow
    too_costly = line(51.0, 0.25 * GOAL_CPU_RATIO + 0.002)
    assert too_costly.endswith(": FAIL") and "CPU per token 1.058x (goal <= 1.05x)" in too_costly
    refused = line(51.0, 0.25, errors=3)  # a refusal is cheaper than a relay: not the cost of admission
    assert refused.endswith(": FAIL") and "9 requests refused or failed" in refused
    assert verdict(figures(rounds(51.0, 0.25)), "tenant-redis", "gateway") is None  # not driven: no verdict


def test_the_report_prints_a_verdict_in_fixed_mode_only(capsys: pytest.CaptureFixture[str]) -> None:
    summary = report(rounds(53.0, 0.25), "fixed", "0.1 0.1 0.1")
    out = capsys.readouterr().out
    assert summary["tenant.verdict"] == "FAIL" and "verdict tenant vs the unified key: TTFT p50 +2.00 ms" in out
    assert "[the gateway's own time +2.000 ms] (goal <= 0.2 ms)" in out
    assert "| tenant | 1.000 | +3.02 ms |" in out  # its row vs direct in the table
    summary = report(rounds(53.0, 0.25), "saturate", "0.1 0.1 0.1")  # TTFT at a relay's limit: no goal
    assert "tenant.verdict" not in summary and "verdict" not in capsys.readouterr().out


def test_the_bench_exits_1_when_a_verdict_fails(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def run_mode(mode: str, args: argparse.Namespace, env: dict[str, str], peers: dict[str, str]) -> dict[str, Any]:
        driven = [r for r in rounds(tenant_ms, 0.25) if r["kind"] != "tenant" or "tenant" in peers]
        return {"mode": mode, "timing": {}, "rounds": driven}

    monkeypatch.setattr(gateway_overhead, "run_mode", run_mode)
    argv = ["--mode", "fixed", "--peers", "tenant", "--json", str(tmp_path / "out.json")]
    tenant_ms = 51.1
    assert gateway_overhead.main(argv) == 0
    assert json.loads((tmp_path / "out.json").read_text())[0]["summary"]["tenant.verdict"] == "PASS"
    tenant_ms = 52.0
    assert gateway_overhead.main(argv) == 1
    assert gateway_overhead.main(["--mode", "fixed", "--peers", "none"]) == 0  # no tenant: nothing to fail


def test_the_tenant_peers_are_chosen_by_name(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def peers(arg: str) -> dict[str, str]:
        return gateway_overhead.choose_peers(gateway_overhead.parse(["--peers", arg]))

    monkeypatch.setattr(gateway_overhead, "find_redis", lambda: "/usr/bin/redis-server")
    assert peers("tenant,tenant-redis") == {"tenant": "tenant", "tenant-redis": "/usr/bin/redis-server"}
    monkeypatch.setattr(gateway_overhead, "find_redis", lambda: None)
    assert peers("tenant,tenant-redis") == {"tenant": "tenant"}
    assert "redis-server is not installed" in capsys.readouterr().err
    with pytest.raises(SystemExit, match=r"unknown tenant-postgres; choose from .*tenant, tenant-redis"):
        peers("tenant-postgres")


def test_the_tenant_gateways_config_and_key(tmp_path: Path) -> None:
    """The tenant-redis gateway's config names the Redis; the key is made as a user makes one, in
    the gateway's SQLite key store, with every limit on."""
    config_path = gateway_overhead.gateway_config(tmp_path / "t", 8001, 8101, "redis://127.0.0.1:6390/0")
    env = {**os.environ, "TAOTOKEN_API_KEY": UNIFIED}
    config = load_config(config_path, env)
    assert config.gateway.redis_url == "redis://127.0.0.1:6390/0" and config.server.api_key == UNIFIED
    assert load_config(gateway_overhead.gateway_config(tmp_path / "u", 8002, 8101), env).gateway.redis_url is None

    secret = gateway_overhead.create_tenant_key(config_path, env)
    store = KeyStore(config.resolve_path(config.gateway.key_store))
    try:
        found = next(r for r in store.keys() if r.digest == store.digest(secret))
    finally:
        store.close()
    assert (found.name, found.limits.rpm, found.limits.tpm, found.limits.max_concurrency) == (
        "bench-tenant",
        10**9,
        10**12,
        100_000,
    )


def test_the_load_generator_sends_each_tenant_target_its_own_key(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    stack = gateway_overhead.Stack(tmp_path, {})
    stack.targets = ["direct=http://127.0.0.1:1", "gateway=http://127.0.0.1:2", "tenant=http://127.0.0.1:3"]
    stack.keys = {"tenant": "zg-secret"}
    seen: list[list[str]] = []

    def run(cmd: list[str], **kwargs: Any) -> None:
        seen.append(cmd)
        (tmp_path / "rounds.json").write_text("[]")

    monkeypatch.setattr(gateway_overhead.subprocess, "run", run)
    args = gateway_overhead.parse(["--rounds", "1"])
    gateway_overhead.drive(stack, gateway_overhead.timing("fixed", args), args)
    cmd = seen[0]
    assert cmd[cmd.index("--key") + 1] == UNIFIED  # every other target: the unified key
    assert cmd[cmd.index("--key-for") + 1] == "tenant=zg-secret"
    assert bench_loadgen.parse_pairs(["tenant=zg=x"]) == {"tenant": "zg=x"}  # a key may hold '='


def test_a_starved_machine_is_named_beside_the_verdict(capsys: pytest.CaptureFixture[str]) -> None:
    report(rounds(51.1, 0.25), "fixed", f"{4 * (os.cpu_count() or 1)}.0 1.0 1.0")
    assert "NOTE: load average" in capsys.readouterr().out
    report(rounds(51.1, 0.25), "fixed", "0.0 0.0 0.0")
    assert "NOTE: load average" not in capsys.readouterr().out


def test_targets_named_together_share_one_window() -> None:
    targets = ["direct", "gateway", "nginx", "tenant", "tenant-redis"]
    assert bench_loadgen.groups(targets, []) == [[t] for t in targets]
    together = bench_loadgen.groups(targets, ["gateway,tenant,tenant-redis"])
    assert together == [["direct"], ["gateway", "tenant", "tenant-redis"], ["nginx"]]
    assert bench_loadgen.groups(targets, ["gateway,workers2"]) == [[t] for t in targets]  # one of them: alone


def test_together_asks_the_load_generator_for_the_gateway_and_its_tenants(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    stack = gateway_overhead.Stack(tmp_path, {})
    stack.targets = ["direct=http://127.0.0.1:1", "gateway=http://127.0.0.1:2", "tenant=http://127.0.0.1:3"]
    stack.keys = {"tenant": "zg-secret"}
    seen: list[list[str]] = []

    def run(cmd: list[str], **kwargs: Any) -> None:
        seen.append(cmd)
        (tmp_path / "rounds.json").write_text("[]")

    monkeypatch.setattr(gateway_overhead.subprocess, "run", run)
    for argv in (["--together"], []):
        args = gateway_overhead.parse(argv)
        gateway_overhead.drive(stack, gateway_overhead.timing("fixed", args), args)
    assert seen[0][seen[0].index("--together") + 1] == "gateway,tenant" and "--together" not in seen[1]
