"""The dashboards against a live stack: Debian's Prometheus scraping a real gateway in front of
simulated engines, under a short bounded load from the real Locust harness and from clients of
other keys (one engine killed on the way, so that errors, retries and a down backend are on the
dashboards too). Checks the series through Prometheus's
HTTP API, renders each console dashboard in headless Chromium, and runs every Grafana query.

ZEROGAP_DASHBOARD_PNG_DIR=DIR keeps the rendered PNGs (the README's pictures)."""

from __future__ import annotations

import os
import re
import shutil
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.checks import ENGINE_SERIES, dashboard_problems, finite_values, wait_for_series
from tests.deploy.load import Load
from tests.deploy.paths import CONSOLE_PAGES, CONSOLES, grafana_panels, recording_rules
from tests.deploy.pictures import drawn_pages
from tests.deploy.stack import Stack, prom_api, start_gateway, start_locust, start_prometheus, start_sim
from tests.tools import require_tool

pytestmark = pytest.mark.slow

MIN_RANGE_S = 20  # the range test waits until the data is this old: a series' first seconds are a small share
MIN_DATA_SHARE = 0.7  # "most of the graph's width"

# Every raw series the dashboards read, as the gateway and the engines export them.
RAW_SERIES = [
    "zerogap_requests_total",
    "zerogap_request_duration_seconds_bucket",
    "zerogap_time_to_first_token_seconds_bucket",
    "zerogap_time_per_output_token_seconds_bucket",
    'zerogap_tokens_total{kind="completion"}',
    'zerogap_tokens_total{kind="prompt"}',
    "zerogap_backend_up",
    "zerogap_backend_inflight",
    "zerogap_retries_total",
    "zerogap_upstream_errors_total",
    "zerogap_ratelimited_total",
    "zerogap_backend_ejections_total",
    "zerogap_panic_attempts_total",
    "zerogap_route_decisions_total",
    "zerogap_route_prefix_match_ratio_count",
    *ENGINE_SERIES,
    "zerogap_sim_gpu_busy_ratio",
    "zerogap_sim_token_interval_seconds",
    "zerogap_sim_cpu_interval_seconds",
    "zerogap_loadtest_users",
    "zerogap_loadtest_num_steps",
    "zerogap_loadtest_output_tokens_total",
    "zerogap_loadtest_ttft_seconds_bucket",
    "zerogap_loadtest_cpu_percent",
    "zerogap_loadtest_gpu_util_percent",
]


def gateway_inflight(stack: Stack, backend: str) -> float:
    request = urllib.request.Request(f"{stack.gateway_url}/metrics", headers=stack.metrics_auth)
    with urllib.request.urlopen(request, timeout=5) as resp:
        text = resp.read().decode()
    for line in text.splitlines():
        if line.startswith("zerogap_backend_inflight{") and f'backend="{backend}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def kill_when_busy(stack: Stack, name: str, proc: Any, timeout_s: float = 20.0) -> None:
    """Kill a backend while the gateway has streams in flight there."""
    deadline = time.monotonic() + timeout_s
    while gateway_inflight(stack, name) < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.kill()
    proc.wait(10)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    require_tool("prometheus"), require_tool("chromium")  # before the stack starts: fail fast
    workdir = tmp_path_factory.mktemp("deploy-live")
    (workdir / "sim.toml").write_text("# every [sim] and [engine] setting at its default\n")
    stack = Stack(workdir)
    load: Load | None = None
    try:
        start_sim(stack, "sim-sync", "sync")
        start_sim(stack, "sim-async", "async")
        doomed = start_sim(stack, "sim-doomed", "async")
        start_gateway(stack)
        start_locust(stack, steps=[2, 4], step_s=120)  # outlasts the module on a busy machine
        start_prometheus(stack)
        load = Load(stack, max_seconds=240).start()
        time.sleep(3)
        kill_when_busy(stack, "sim-doomed", doomed)
        wait_for_series(stack, [*RAW_SERIES, *recording_rules()], timeout_s=60)
        yield stack
    finally:
        if load is not None:
            load.close()
        stack.stop()


def test_load_reached_the_gateway(live: Stack) -> None:
    """The bounded load ran: the counters move (the dashboards below depend on it)."""
    tps = finite_values(prom_api(live, "query", query="sum(zerogap:output_tokens:rate15s)")["result"])
    assert tps and tps[0] > 0
    limited = prom_api(live, "query", query='sum(zerogap_ratelimited_total{key="limited"})')["result"]
    assert finite_values(limited) and finite_values(limited)[0] >= 1


def test_prometheus_scrapes_the_gateway_with_its_metrics_key(live: Stack) -> None:
    """The gateway runs with [server].metrics_key: /metrics without it is refused, and Prometheus,
    sending it from a file as the compose and k8s configs do, scrapes the gateway all the same."""
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"{live.gateway_url}/metrics", timeout=5)
    refused.value.close()  # the error holds the response's socket
    assert refused.value.code == 401
    targets = prom_api(live, "targets")["activeTargets"]
    (gateway,) = [t for t in targets if t["labels"]["job"] == "zerogap-gateway"]
    assert gateway["health"] == "up", gateway["lastError"]


def test_series_exist_with_values(live: Stack) -> None:
    found = wait_for_series(live, [*RAW_SERIES, *recording_rules()], timeout_s=10)
    assert all(found.values())
    busy = found["zerogap_sim_gpu_busy_ratio"]
    assert all(0 <= v <= 1 for v in busy)
    up = prom_api(live, "query", query="zerogap_backend_up")["result"]
    assert {r["metric"]["backend"]: r["value"][1] for r in up} == {"sim-sync": "1", "sim-async": "1", "sim-doomed": "0"}


def test_ejections_and_cache_aware_routing_reach_prometheus(live: Stack) -> None:
    """The killed engine left the pool exactly once (it never came back; every backend's series
    exists from the start); the shared prefixes were routed by affinity, and the engines found
    prompt tokens in their prefix caches."""
    left = prom_api(live, "query", query="sum by (backend) (zerogap_backend_ejections_total)")["result"]
    times_left = {r["metric"]["backend"]: float(r["value"][1]) for r in left}
    assert times_left.keys() == {"sim-sync", "sim-async", "sim-doomed"} and times_left["sim-doomed"] == 1, times_left
    affinity = prom_api(live, "query", query='sum(zerogap_route_decisions_total{reason="affinity"})')["result"]
    assert finite_values(affinity)[0] > 0
    hits = prom_api(live, "query", query="sum(vllm:prefix_cache_hits_total)")["result"]
    assert finite_values(hits)[0] > 0


def test_gpu_utilization_comes_from_the_sims_without_dcgm(live: Stack) -> None:
    result = prom_api(live, "query", query="zerogap:gpu_util:ratio")["result"]
    assert {r["metric"]["source"] for r in result} == {"sim"}
    assert {r["metric"]["backend"] for r in result} == {"sim-sync", "sim-async"}


@pytest.mark.parametrize("page", CONSOLE_PAGES)
def test_console_dashboard_shows_data(live: Stack, page: str, tmp_path: Path) -> None:
    png = tmp_path / page.replace(".html", ".png")
    assert dashboard_problems(live, page, png) == []
    keep = os.environ.get("ZEROGAP_DASHBOARD_PNG_DIR")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(png, Path(keep) / png.name)


def data_start_s(stack: Stack) -> float:
    """When Prometheus's data begins: its first scrape of the gateway."""
    end = time.time()
    data = prom_api(
        stack, "query_range", query='up{job="zerogap-gateway"}', start=str(end - 900), end=str(end), step="1"
    )
    return min(float(v[0]) for r in data["result"] for v in r["values"])


def test_console_graphs_span_the_range_they_state(live: Stack) -> None:
    """Each page with ?range= as long as the load has run (the data's age, whole seconds): the time
    control states that range, every graph asks for it and draws an x axis that long (not the hour
    prom_console.js defaults to), and the load's samples fill most of it; no panel shows NaN."""
    start_s = data_start_s(live)
    while time.time() - start_s < MIN_RANGE_S:  # after the pages above it never waits; run alone, it may
        time.sleep(1)
    range_s = int(time.time() - start_s)
    drawn = drawn_pages(
        live.prometheus_url, live.workdir / "consoles", {p: f"{p}?range={range_s}s" for p in CONSOLE_PAGES}
    )
    for page, shown in drawn.items():
        assert shown.range_s == range_s, (page, shown.range_text)
        assert shown.nan_lines == [], page
        for graph in shown.graphs:
            assert graph.error is None and graph.duration_s == range_s, (page, graph)
            assert abs(graph.domain_s - range_s) <= 0.02 * range_s, (page, graph)
            assert graph.data_share >= MIN_DATA_SHARE, (page, graph)


def shown_step(stack: Stack) -> str:
    with urllib.request.urlopen(f"{stack.prometheus_url}/consoles/loadtest.html", timeout=10) as resp:
        page = resp.read().decode()
    cells = re.findall(r"<td>(.*?)</td>", page[page.index('class="zg-big"') :], flags=re.DOTALL)
    return re.sub(r"<[^>]+>", "", cells[1]).strip()  # Users, Step, ...


def test_load_generator_page_counts_steps_from_one(live: Stack) -> None:
    """The harness exports the step running now from 0 (its console prints "step 1/2" for it): the
    page shows it from 1 of the run's 2 steps, "1 / 2", as the console does. Read between two equal
    readings of the exporter's figure, so that a step that changes meanwhile is read again."""
    for _ in range(5):
        before = finite_values(prom_api(live, "query", query="max(zerogap_loadtest_step)")["result"])
        shown = shown_step(live)
        after = finite_values(prom_api(live, "query", query="max(zerogap_loadtest_step)")["result"])
        if before == after:
            break
    assert before == after and before[0] in (0, 1), (before, after)  # steps [2, 4]: 0 or 1 while the load runs
    assert shown == f"{before[0] + 1:.0f} / 2"


def test_dashboard_check_can_fail(live: Stack, tmp_path: Path) -> None:
    """The same check on a page whose graph and value read a series nobody exports."""
    page = (CONSOLES / "index.html").read_text().replace("zerogap:output_tokens:rate15s", "zerogap:no_such:series")
    page = page.replace("zerogap:gpu_util:avg_ratio", "zerogap:no_such:ratio")  # a graph of one query
    (live.workdir / "consoles" / "broken.html").write_text(page)
    problems = dashboard_problems(live, "broken.html", tmp_path / "broken.png")
    assert "a value or table found no data" in problems
    assert "graph query without data: sum by (model) (zerogap:no_such:series)" in problems
    assert "a graph says 'No timeseries returned' or 'Error loading data'" in problems


@pytest.mark.parametrize("panel", grafana_panels(), ids=lambda p: p["title"])
def test_grafana_panel_query_returns_data(live: Stack, panel: dict[str, Any]) -> None:
    end = time.time()
    found = []
    for target in panel["targets"]:
        if target.get("instant"):
            data = prom_api(live, "query", query=target["expr"])
        else:
            data = prom_api(live, "query_range", query=target["expr"], start=str(end - 60), end=str(end), step="2")
        found.extend(finite_values(data["result"]))
    assert found, f"{panel['title']}: no data from {[t['expr'] for t in panel['targets']]}"
