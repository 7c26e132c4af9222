"""deploy/grafana: the dashboard JSON is well formed for Grafana and wired to the provisioned
datasource and to the folder compose mounts; its stat panels' queries, run by promtool, read as
the console pages do (step from 1, 1-minute means that fall to 0 together, NaN in words). (Its
queries run live in test_live_dashboards, and on an idle stack in test_console_range.)"""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.deploy.grafana_display import P99_TILES, STEP, grafana_panel, shown
from tests.deploy.paths import COMPOSE, DEPLOY, GRAFANA_DASHBOARD, RULES, grafana_panels, load_yaml
from tests.tools import require_tool

PROVISIONING = DEPLOY / "grafana" / "provisioning"


def dashboard() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(GRAFANA_DASHBOARD.read_text())
    return doc


def cells(panel: dict[str, Any]) -> set[tuple[int, int]]:
    g = panel["gridPos"]
    return {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}


def test_panels_have_ids_titles_and_fit_the_grid() -> None:
    panels = dashboard()["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    taken: set[tuple[int, int]] = set()
    for panel in panels:
        g = panel["gridPos"]
        assert panel["title"] and 0 <= g["x"] and g["x"] + g["w"] <= 24 and g["h"] >= 1
        assert not cells(panel) & taken, f"{panel['title']} overlaps another panel"
        taken |= cells(panel)


def test_every_query_uses_the_provisioned_datasource() -> None:
    (source,) = load_yaml(PROVISIONING / "datasources" / "prometheus.yml")["datasources"]
    assert source["type"] == "prometheus"
    wanted = {"type": "prometheus", "uid": source["uid"]}
    for panel in grafana_panels():
        assert panel["datasource"] == wanted
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == wanted
            assert target["expr"].strip() and "$" not in target["expr"], "no template variables to resolve"


def test_dashboards_folder_is_what_compose_mounts() -> None:
    (provider,) = load_yaml(PROVISIONING / "dashboards" / "zerogap.yml")["providers"]
    grafana = load_yaml(COMPOSE)["services"]["grafana"]
    mounts = {v.split(":")[1]: v.split(":")[0] for v in grafana["volumes"]}
    assert mounts[provider["options"]["path"]] == "../grafana/dashboards"
    assert mounts["/etc/grafana/provisioning"] == "../grafana/provisioning"
    assert grafana["environment"]["PROMETHEUS_URL"] == "http://prometheus:9090"


def test_rows_match_the_console_pages() -> None:
    rows = [p["title"].split(":")[0].split(" (")[0] for p in dashboard()["panels"] if p["type"] == "row"]
    assert rows == ["Overview", "Latency", "GPU", "Backends", "Keys", "Load generator", "Routing"]


# ----- what the stat panels show: Prometheus's own engine (promtool) on the panels' queries -----

OVERVIEW_ACTIVITY = [2, 3, 4, 7]  # output TPS (gateway, engines), requests/s, GPU utilization
LOADTEST_ACTIVITY = [36, 39]  # output TPS (client), GPU utilization (harness)


def expr(panel_id: int) -> str:
    (target,) = grafana_panel(panel_id)["targets"]
    return str(target["expr"])


def promtool_test(tmp_path: Path, series: list[tuple[str, list[float]]], checks: list[tuple[str, str, float]]) -> str:
    """promtool test rules with the recording rules: input series 5 s apart (prometheus.yml's scrape
    interval, which the rules' 15 s windows are three of), and for each check
    (expression, eval time, value) the one label-less sample it must give; '' when they all pass."""
    test = {
        "rule_files": [str(RULES)],
        "evaluation_interval": "5s",
        "tests": [
            {
                "interval": "5s",
                "input_series": [{"series": s, "values": " ".join(f"{v:g}" for v in vs)} for s, vs in series],
                "promql_expr_test": [
                    {"expr": e, "eval_time": t, "exp_samples": [{"labels": "{}", "value": v}]} for e, t, v in checks
                ],
            }
        ],
    }
    path = tmp_path / "grafana.test.yml"
    path.write_text(yaml.safe_dump(test, sort_keys=False))
    done = subprocess.run(
        [require_tool("promtool"), "test", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    return "" if done.returncode == 0 and "SUCCESS" in done.stdout else done.stdout + done.stderr


def active(panel_ids: list[int]) -> str:
    """How many of the panels' queries are above 0."""
    return " + ".join(f"(({expr(i)}) > bool 0)" for i in panel_ids)


def test_step_reads_as_the_console_prints_it(tmp_path: Path) -> None:
    """The harness exports the step from 0 and -1 in warm-up and when no test runs (users 0): the
    Step tile reads 'no users', 'warm-up', 1, 2, 'no users' through a run of two steps, as the
    console prints "step 1/2" and "step 2/2"."""
    phases = [("idle", -1, 0, "no users"), ("warm-up", -1, 2, "warm-up"), ("step 1", 0, 2, "1"),
              ("step 2", 1, 4, "2"), ("after the run", -1, 0, "no users")]  # fmt: skip
    steps = [float(step) for _, step, _, _ in phases for _ in range(12)]  # a minute each (5 s apart)
    users = [float(n) for _, _, n, _ in phases for _ in range(12)]
    series = [("zerogap_loadtest_step", steps), ("zerogap_loadtest_users", users)]
    values = {"no users": -1.0, "warm-up": 0.0, "1": 1.0, "2": 2.0}
    checks = [(expr(STEP), f"{60 * i + 30}s", values[text]) for i, (_, _, _, text) in enumerate(phases)]
    assert promtool_test(tmp_path, series, checks) == ""
    assert [shown(grafana_panel(STEP), values[text]) for *_, text in phases] == [text for *_, text in phases]


def test_activity_tiles_fall_to_0_together_when_a_run_ends(tmp_path: Path) -> None:
    """Ten minutes of load, then nothing: Overview's TPS, requests/s and GPU tiles and the Load
    generator's client TPS and harness GPU tiles are all above 0 during the run and 5 s after it
    (each over the last 15 s), and all 0 once 30 s have passed: never TPS beside GPU 0 %."""
    busy, idle = range(120), range(60)  # 5 s apart: 0..595 s busy, 600..895 s idle
    series = [
        ('zerogap_tokens_total{kind="completion", model="m"}', [250.0 * i for i in busy] + [30000.0 for _ in idle]),
        ('vllm:generation_tokens_total{backend="b0"}', [250.0 * i for i in busy] + [30000.0 for _ in idle]),
        ('zerogap_requests_total{model="m", status="200"}', [2.5 * i for i in busy] + [300.0 for _ in idle]),
        ('zerogap_sim_gpu_busy_ratio{backend="b0"}', [0.8 for _ in busy] + [0.0 for _ in idle]),
        ("zerogap_loadtest_output_tokens_total", [250.0 * i for i in busy] + [30000.0 for _ in idle]),
        ("zerogap_loadtest_gpu_util_percent", [80.0 for _ in busy] + [0.0 for _ in idle]),  # 0 at the test's stop
    ]
    checks: list[tuple[str, str, float]] = []
    for ids in (OVERVIEW_ACTIVITY, LOADTEST_ACTIVITY):
        checks += [(active(ids), "300s", len(ids)), (active(ids), "600s", len(ids)), (active(ids), "630s", 0)]
    assert promtool_test(tmp_path, series, checks) == ""


def test_p99_tiles_read_no_requests_for_nan() -> None:
    """A quantile over a minute without requests is NaN (null, once Grafana's reducer skips NaN):
    the p99 tiles say so in words. (Which panels are NaN on an idle stack: test_console_range.)"""
    for panel_id in P99_TILES:
        assert shown(grafana_panel(panel_id), math.nan) == shown(grafana_panel(panel_id), None) == "no requests"
        assert shown(grafana_panel(panel_id), 0.25) == "0.25"


def test_the_dashboard_opens_on_the_last_15_minutes() -> None:
    """A load-test run is minutes long: the dashboard's range is the last 15 minutes, as the
    console pages' is, and no panel has a range of its own."""
    assert dashboard()["time"] == {"from": "now-15m", "to": "now"}
    for p in grafana_panels():
        assert not {"timeFrom", "timeShift"} & p.keys(), p["title"]
