"""Where the deploy files are, and small readers shared by the deploy tests."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
PROMETHEUS = DEPLOY / "prometheus"
CONSOLES = PROMETHEUS / "consoles"
LIBRARIES = PROMETHEUS / "console_libraries"
RULES = PROMETHEUS / "rules" / "zerogap.rules.yml"
GRAFANA_DASHBOARD = DEPLOY / "grafana" / "dashboards" / "zerogap.json"
COMPOSE = DEPLOY / "compose" / "docker-compose.yml"
K8S = DEPLOY / "k8s"

CONSOLE_PAGES = [
    "index.html",
    "latency.html",
    "gpu.html",
    "backends.html",
    "keys.html",
    "loadtest.html",
    "routing.html",
]

_RECORDED = re.compile(r"\bzerogap:[a-z0-9_]+:[a-z0-9_]+\b")


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def recording_rules() -> dict[str, str]:
    """record name -> expression (the first rule of a name)."""
    rules: dict[str, str] = {}
    for group in load_yaml(RULES)["groups"]:
        for rule in group["rules"]:
            rules.setdefault(rule["record"], rule["expr"])
    return rules


def grafana_panels() -> list[dict[str, Any]]:
    """Every non-row panel of the dashboard, rows' nested panels included."""
    out: list[dict[str, Any]] = []
    for panel in json.loads(GRAFANA_DASHBOARD.read_text(encoding="utf-8"))["panels"]:
        out.extend(panel.get("panels", []) if panel["type"] == "row" else [panel])
    return out


def grafana_exprs() -> list[str]:
    return [target["expr"] for panel in grafana_panels() for target in panel["targets"]]


def recorded_names_in(text: str) -> set[str]:
    return set(_RECORDED.findall(text))
