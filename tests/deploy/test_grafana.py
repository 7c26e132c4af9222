"""deploy/grafana: the dashboard JSON is well formed for Grafana and wired to the provisioned
datasource and to the folder compose mounts. (Its queries run live in test_live_dashboards.)"""

from __future__ import annotations

import json
from typing import Any

from tests.deploy.paths import COMPOSE, DEPLOY, GRAFANA_DASHBOARD, grafana_panels, load_yaml

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
