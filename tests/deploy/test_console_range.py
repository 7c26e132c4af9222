"""The console dashboards when nothing is running: a real gateway and simulated engine that served
one request before Prometheus started (so every counter and histogram exists and stands still),
and the Locust harness idle in its web UI (its exporter serves, no test started). Each page, drawn
by headless Chromium with no range in its URL, states 15 minutes and its graphs span them; no
panel shows NaN, nor does any Grafana panel's query as its value mappings show it. The links
between the pages carry the range to the next page. And Overview's activity figures rise and fall
together when a run ends (Prometheus's own engine, promtool, on the page's expressions)."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from common.net import free_port
from tests.deploy.grafana_display import NO_VALUE, P99_TILES, STEP, shown
from tests.deploy.paths import CONSOLE_PAGES, CONSOLES, REPO, RULES, grafana_panels
from tests.deploy.pictures import DrawnPage, drawn_pages
from tests.deploy.stack import MODEL, UNIFIED_KEY, Stack, prom_api, start_gateway, start_prometheus, start_sim
from tests.tools import require_tool

pytestmark = pytest.mark.slow

DEFAULT_RANGE_S = 900  # what the pages state: "15m"
# Series that are NaN while nothing runs (a quantile or a mean over a window without requests).
IDLE_NAN = [
    "zerogap:ttft_seconds:quantile15s",
    "zerogap:tpot_seconds:quantile15s",
    "zerogap:request_duration_seconds:quantile15s",
    "zerogap:loadtest_ttft_seconds:quantile15s",
    "zerogap:route_prefix_match:mean15s",
    "zerogap:prefix_cache_hit:ratio15s",
]
# Pages with a value that would be NaN now, and so must say so in words.
IDLE_PAGES = ["index.html", "latency.html", "loadtest.html", "routing.html"]
# Beside the pages as a user opens them: the ways to ask for another range.
ASKED = {
    "hash": 'index.html#pctc{"duration":300,"endTime":0}',
    "range=90s": "index.html?range=90s",
    "range=abc": "index.html?range=abc",
}
END_S = int(time.time()) // 60 * 60  # an end time as the controls write it (whole minutes)
NAV = {  # pages whose links are followed: the page, and the button clicked on it first
    "nav range=90s": ("latency.html?range=90s", None),
    "nav end": (f'gpu.html#pctc{{"duration":600,"endTime":{END_S}}}', None),
    "nav shrunk": ("keys.html", "prom_graph_duration_shrink"),  # 15m -> 5m, as a user clicks "-"
}


def one_request(stack: Stack) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "One request, then nothing. " * 60}],  # blocks to route on
        "max_tokens": 8,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    headers = {"Authorization": f"Bearer {UNIFIED_KEY}", "Content-Type": "application/json"}
    request = urllib.request.Request(
        f"{stack.gateway_url}/v1/chat/completions", data=json.dumps(body).encode(), headers=headers
    )
    with urllib.request.urlopen(request, timeout=60) as resp:
        assert resp.status == 200 and b"[DONE]" in resp.read()


def start_idle_locust(stack: Stack) -> None:
    """`locust -f loadtest/` with its web UI on a free port and no test started: the exporter serves."""
    stack.loadtest_port = free_port()
    settings = {
        "api": {"base_url": f"{stack.gateway_url}/api", "api_key_env": "ZEROGAP_IDLE_KEY"},
        "workload": {"model": MODEL},
        "metrics": {"exporter_port": stack.loadtest_port},
        "output": {"dir": str(stack.workdir / "runs")},
    }
    path = stack.workdir / "settings.json"
    path.write_text(json.dumps(settings))
    cmd = [sys.executable, "-m", "locust", "-f", str(REPO / "loadtest"), "--settings", str(path)]
    cmd += ["--web-host", "127.0.0.1", "--web-port", str(free_port())]
    stack.spawn("locust", cmd, stack.loadtest_port, timeout_s=60, env={**os.environ, "ZEROGAP_IDLE_KEY": UNIFIED_KEY})


def wait_for_nan(stack: Stack, names: list[str], timeout_s: float) -> None:
    """Poll until each recorded series has a NaN value (its window holds only samples that stand still)."""
    deadline = time.monotonic() + timeout_s
    while True:
        values = {n: [r["value"][1] for r in prom_api(stack, "query", query=n)["result"]] for n in names}
        missing = [n for n, found in values.items() if "NaN" not in found]
        if not missing:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"not NaN after {timeout_s} s: { {n: values[n] for n in missing} }")
        time.sleep(0.5)


@pytest.fixture(scope="module")
def idle(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    require_tool("prometheus"), require_tool("chromium")
    workdir = tmp_path_factory.mktemp("deploy-idle")
    (workdir / "sim.toml").write_text("# every [sim] and [engine] setting at its default\n")
    stack = Stack(workdir)
    try:
        start_sim(stack, "sim-idle", "async")
        start_gateway(stack)
        one_request(stack)
        start_idle_locust(stack)
        start_prometheus(stack)
        wait_for_nan(stack, IDLE_NAN, timeout_s=60)
        yield stack
    finally:
        stack.stop()


@pytest.fixture(scope="module")
def drawn(idle: Stack) -> dict[str, DrawnPage]:
    urls = {page: page for page in CONSOLE_PAGES} | ASKED | {name: url for name, (url, _) in NAV.items()}
    clicks = {name: button for name, (_, button) in NAV.items() if button}
    return drawn_pages(idle.prometheus_url, idle.workdir / "consoles", urls, clicks=clicks)


@pytest.fixture(scope="module")
def followed(idle: Stack, drawn: dict[str, DrawnPage]) -> dict[str, DrawnPage]:
    """The pages that the Routing link of each NAV page leads to."""
    urls = {name: next(h for h in drawn[name].nav_hrefs if h.split("?")[0].split("#")[0].endswith("/routing.html"))
            for name in NAV}  # fmt: skip
    return drawn_pages(idle.prometheus_url, idle.workdir / "consoles", urls)


def served(stack: Stack, page: str) -> str:
    with urllib.request.urlopen(f"{stack.prometheus_url}/consoles/{page}", timeout=10) as resp:
        return resp.read().decode()


def assert_spans(page: DrawnPage, range_s: float) -> None:
    """Every graph queried range_s and every graph drawn spans it (within a step of 1/1000 of it)."""
    for graph in page.graphs:
        assert graph.duration_s == range_s, graph
        if graph.domain is not None:
            assert math.isclose(graph.domain_s, range_s, rel_tol=0.02), graph


@pytest.mark.parametrize("page", CONSOLE_PAGES)
def test_idle_page_states_15_minutes_and_its_graphs_span_them(drawn: dict[str, DrawnPage], page: str) -> None:
    """No range in the URL: the time control says 15m, every graph asks for 15 minutes and draws
    an x axis 15 minutes long (prom_console.js alone would draw 1 hour under the same words)."""
    shown = drawn[page]
    assert shown.range_text == "15m" and shown.range_s == DEFAULT_RANGE_S
    assert shown.graphs, "no graph on the page"
    assert_spans(shown, DEFAULT_RANGE_S)


def test_idle_pages_draw_graphs(drawn: dict[str, DrawnPage]) -> None:
    """The span check above had graphs to look at: idle series are drawn (as gaps where NaN)."""
    num_drawn = sum(graph.domain is not None for page in CONSOLE_PAGES for graph in drawn[page].graphs)
    assert num_drawn >= 10


@pytest.mark.parametrize(("asked", "range_text"), [("hash", "5m"), ("range=90s", "90s"), ("range=abc", "15m")])
def test_a_range_asked_for_in_the_url_is_the_range_drawn(
    drawn: dict[str, DrawnPage], asked: str, range_text: str
) -> None:
    """The time controls' #pctc hash and ?range= both set the range; a range that is not one falls back to 15m."""
    shown = drawn[asked]
    assert shown.range_text == range_text
    assert_spans(shown, shown.range_s)
    assert any(graph.domain is not None for graph in shown.graphs)


@pytest.mark.parametrize("page", CONSOLE_PAGES)
def test_idle_panels_show_no_nan(idle: Stack, drawn: dict[str, DrawnPage], page: str) -> None:
    """While the series behind them are NaN (the fixture waited for it), tables and tiles say so in
    words and graphs leave gaps: "NaN" appears nowhere, neither as served nor as drawn."""
    html = served(idle, page)
    assert "NaN" not in re.sub(r"<script.*?</script>", "", html, flags=re.DOTALL)
    assert drawn[page].nan_lines == []
    if page in IDLE_PAGES:
        assert 'class="zg-idle"' in html, "no idle value on a page whose series are NaN now"


def test_idle_overview_reads_no_requests_and_zero(idle: Stack) -> None:
    tiles = re.sub(r"\s+", " ", served(idle, "index.html"))
    assert "no requests</span>" in tiles
    assert ">0.0 tok/s</a>" in tiles and ">0%</a>" in tiles, "TPS and GPU utilization at 0 while idle"


def carried(href: str) -> dict[str, object]:
    """What a link carries to the next page: its ?range= or its #pctc hash, decoded."""
    parts = urllib.parse.urlsplit(href)
    if parts.fragment.startswith("pctc"):
        values: dict[str, object] = json.loads(urllib.parse.unquote(parts.fragment[4:]))
        return values
    return {"range": urllib.parse.parse_qs(parts.query).get("range")}


@pytest.mark.parametrize(
    ("name", "wanted"),
    [
        ("range=90s", {"range": ["90s"]}),
        ("hash", {"range": ["5m"]}),  # 300 s up to now: ?range= says it
        ("nav shrunk", {"range": ["5m"]}),
        ("nav end", {"duration": 600, "endTime": END_S}),  # an end time: only the hash says it
        ("index.html", {"range": ["15m"]}),
    ],
)
def test_links_between_pages_carry_the_range(drawn: dict[str, DrawnPage], name: str, wanted: object) -> None:
    hrefs = drawn[name].nav_hrefs
    assert len(hrefs) == len(CONSOLE_PAGES) + 1, hrefs  # the brand and one link per page
    assert [urllib.parse.urlsplit(h).path for h in hrefs[1:]] == [f"/consoles/{p}" for p in CONSOLE_PAGES]
    assert all(carried(h) == wanted for h in hrefs), hrefs


@pytest.mark.parametrize("name", NAV)
def test_the_next_page_shows_the_range_of_the_page_before(
    drawn: dict[str, DrawnPage], followed: dict[str, DrawnPage], name: str
) -> None:
    """Followed, a link opens the next page on the range (and end time) the page before stated."""
    before, after = drawn[name], followed[name]
    assert after.range_text == before.range_text != "15m"
    assert_spans(after, before.range_s)
    if name == "nav end":
        assert {g.end_s for g in before.graphs + after.graphs} == {END_S}


def test_idle_grafana_panels_show_no_nan(idle: Stack) -> None:
    """Every Grafana panel's query on the idle stack, shown as its value mappings show it (the
    value, or null as newer reducers make of NaN): never "NaN" nor "No data". The p99 tiles are
    among those that are NaN now, and the Step tile reads 'no users'."""
    nan_panels = set()
    for panel in grafana_panels():
        for target in panel["targets"]:
            for result in prom_api(idle, "query", query=target["expr"])["result"]:
                value = float(result["value"][1])
                for seen in [value, None] if math.isnan(value) else [value]:
                    assert shown(panel, seen) not in ("NaN", NO_VALUE), (panel["title"], target["expr"])
                if math.isnan(value):
                    nan_panels.add(panel["id"])
    assert set(P99_TILES) <= nan_panels
    ((step_target,),) = [p["targets"] for p in grafana_panels() if p["id"] == STEP]
    (step,) = prom_api(idle, "query", query=step_target["expr"])["result"]
    assert shown(next(p for p in grafana_panels() if p["id"] == STEP), float(step["value"][1])) == "no users"


# ----- Overview after a run: promtool on the page's own expressions -----


def overview_activity_exprs() -> list[str]:
    """Overview's tiles that measure activity (TPS, requests/s, GPU utilization): not the
    percentiles (NaN when idle, shown in words) nor the backends up."""
    page = (CONSOLES / "index.html").read_text()
    tiles = page[page.index("zg-tiles") : page.index("</table>")]
    exprs = re.findall(r'\{\{ template "zg_value" \(args "([^"]+)"', tiles)
    return [e for e in exprs if "quantile" not in e and "backend_up" not in e]


def after_run_test(exprs: list[str]) -> dict[str, object]:
    """A promtool unit test: 10 minutes of load (tokens, requests, a GPU 80 % busy), then nothing;
    how many of exprs are above 0 during the run, 5 s after its end, and 30 s after."""
    busy, idle = "x120", "x60"  # 5 s apart: 0..600 s busy, 605..905 s idle
    series = [
        ('zerogap_tokens_total{kind="completion", model="m"}', f"0+500{busy} 60000{idle}"),
        ('vllm:generation_tokens_total{backend="b0"}', f"0+500{busy} 60000{idle}"),
        ('zerogap_requests_total{model="m", status="200"}', f"0+5{busy} 600{idle}"),
        ('zerogap_sim_gpu_busy_ratio{backend="b0"}', f"0.8{busy} 0{idle}"),
    ]
    active = " + ".join(f"(({e}) > bool 0)" for e in exprs)
    checks = [("300s", len(exprs)), ("605s", len(exprs)), ("630s", 0)]
    return {
        "rule_files": [str(RULES)],
        "evaluation_interval": "5s",
        "tests": [
            {
                "interval": "5s",
                "input_series": [{"series": s, "values": v} for s, v in series],
                "promql_expr_test": [
                    {"expr": active, "eval_time": t, "exp_samples": [{"labels": "{}", "value": n}]} for t, n in checks
                ],
            }
        ],
    }


def test_overview_figures_fall_together_when_a_run_ends(tmp_path: Path) -> None:
    """Output TPS, engines' TPS, requests/s and GPU utilization are all above 0 during a run and
    5 s after it (each over the last 15 s), and all 0 once 30 s have passed: never 1,582 tok/s
    beside GPU 0 %, nor TPS a minute after the run."""
    exprs = overview_activity_exprs()
    assert len(exprs) == 4 and any("gpu_util" in e for e in exprs), exprs
    test_file = tmp_path / "after-run.test.yml"
    test_file.write_text(yaml.safe_dump(after_run_test(exprs), sort_keys=False))
    done = subprocess.run(
        [require_tool("promtool"), "test", "rules", str(test_file)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and "SUCCESS" in done.stdout, done.stdout + done.stderr
