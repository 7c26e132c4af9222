"""The Prometheus config, recording rules and console templates, checked by Debian's promtool."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from tests.deploy.paths import (
    CONSOLE_PAGES,
    CONSOLES,
    DEPLOY,
    LIBRARIES,
    PROMETHEUS,
    RULES,
    grafana_exprs,
    load_yaml,
    recorded_names_in,
    recording_rules,
)
from tests.tools import require_tool

# The metric names of the brief's contract (gateway, engines, DCGM); anything else is a typo.
CONTRACT_METRICS = {
    "zerogap_requests_total",
    "zerogap_request_duration_seconds",
    "zerogap_time_to_first_token_seconds",
    "zerogap_time_per_output_token_seconds",
    "zerogap_tokens_total",
    "zerogap_backend_up",
    "zerogap_backend_inflight",
    "zerogap_retries_total",
    "zerogap_upstream_errors_total",
    "zerogap_ratelimited_total",
    "zerogap_backend_ejections_total",
    "zerogap_panic_attempts_total",
    "zerogap_sim_gpu_busy_ratio",
    "zerogap_sim_token_interval_seconds",
    "zerogap_sim_cpu_interval_seconds",
    # The gateway's cache-aware router (gateway/routing/metrics.py).
    "zerogap_route_decisions_total",
    "zerogap_route_prefix_match_ratio",
    "zerogap_route_prefix_table_bytes",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:time_to_first_token_seconds",
    "vllm:inter_token_latency_seconds",
    "vllm:e2e_request_latency_seconds",
    "vllm:iteration_tokens_total",
    "vllm:prefix_cache_hits_total",
    "vllm:prefix_cache_queries_total",
    "DCGM_FI_DEV_GPU_UTIL",
    # The Locust harness's exporter (loadgen/exporter.py).
    "zerogap_loadtest_users",
    "zerogap_loadtest_step",
    "zerogap_loadtest_num_steps",
    "zerogap_loadtest_requests_total",
    "zerogap_loadtest_output_tokens_total",
    "zerogap_loadtest_ttft_seconds",
    "zerogap_loadtest_tpot_seconds",
    "zerogap_loadtest_cpu_percent",
    "zerogap_loadtest_gpu_util_percent",
}
_RAW_METRIC = re.compile(r"\b(zerogap_[a-z_]+|vllm:[a-z_]+|DCGM_FI_[A-Z_]+)\b(?!\*)")  # "zerogap_loadtest_*": prose


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([require_tool("promtool"), *args], capture_output=True, text=True, timeout=60, check=False)


def raw_metric_names(text: str) -> set[str]:
    names = set(_RAW_METRIC.findall(text))
    return {re.sub(r"_(bucket|sum|count)$", "", n) for n in names}


def test_prometheus_config_is_valid() -> None:
    done = promtool("check", "config", str(PROMETHEUS / "prometheus.yml"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "rule files found" in done.stdout


def test_recording_rules_compute_what_they_claim() -> None:
    done = promtool("test", "rules", str(PROMETHEUS / "rules" / "zerogap.rules.test.yml"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_promtool_rejects_a_broken_rule(tmp_path: Path) -> None:
    """The check above can fail: a rule with a PromQL syntax error is refused."""
    broken = RULES.read_text().replace("sum by (model) (rate(", "sum by (model) (rate((", 1)
    (tmp_path / "broken.yml").write_text(broken)
    assert promtool("check", "rules", str(tmp_path / "broken.yml")).returncode != 0


def test_scrape_jobs_cover_gateway_backends_dcgm_and_loadtest() -> None:
    config = load_yaml(PROMETHEUS / "prometheus.yml")
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert set(jobs) == {"zerogap-gateway", "zerogap-backends", "dcgm", "zerogap-loadtest"}
    assert jobs["zerogap-gateway"]["static_configs"][0]["targets"] == ["127.0.0.1:8000"]
    assert jobs["dcgm"]["static_configs"][0]["targets"] == ["127.0.0.1:9400"]
    backend_files = jobs["zerogap-backends"]["file_sd_configs"][0]["files"]
    groups = load_yaml(PROMETHEUS / backend_files[0])
    assert groups[0]["targets"] == ["127.0.0.1:8100"], "backends start at 8100 (the brief's default)"
    assert all("backend" in group["labels"] for group in groups)


def test_every_metric_named_is_in_the_contract() -> None:
    texts = [RULES.read_text(), DEPLOY.joinpath("grafana/dashboards/zerogap.json").read_text()]
    texts += [(CONSOLES / page).read_text() for page in CONSOLE_PAGES]
    unknown = set().union(*(raw_metric_names(t) for t in texts)) - CONTRACT_METRICS
    assert not unknown, f"metric names outside the contract: {sorted(unknown)}"


def test_console_pages_and_grafana_use_only_defined_recording_rules() -> None:
    defined = set(recording_rules())
    consoles = set().union(*(recorded_names_in((CONSOLES / p).read_text()) for p in CONSOLE_PAGES))
    grafana = set().union(*(recorded_names_in(e) for e in grafana_exprs()))
    assert consoles <= defined, consoles - defined
    assert grafana <= defined, grafana - defined
    # The same dashboards: both plot the same recorded series.
    assert consoles == grafana, {"consoles only": consoles - grafana, "grafana only": grafana - consoles}


def test_console_pages_are_linked_from_the_navigation() -> None:
    library = (LIBRARIES / "zerogap.lib").read_text()
    for page in CONSOLE_PAGES:
        assert f'"{page}"' in library, f"{page} missing from the navbar"
    assert sorted(p.name for p in CONSOLES.glob("*.html")) == sorted(CONSOLE_PAGES)
