"""Checks shared by the live dashboard tests: series through Prometheus's HTTP API, and a
console page as served, as its scripts draw it in headless Chromium, and as a PNG."""

from __future__ import annotations

import json
import math
import re
import time
import urllib.request
from pathlib import Path
from typing import Any

from tests.deploy.pictures import ink_fraction, size
from tests.deploy.stack import Stack, prom_api
from tests.render import inspect_page, render_png

# The engine series the dashboards read, as vLLM and the simulated engine both export them.
ENGINE_SERIES = [
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:generation_tokens_total",
    "vllm:prompt_tokens_total",
    "vllm:time_to_first_token_seconds_bucket",
    "vllm:inter_token_latency_seconds_bucket",
    "vllm:e2e_request_latency_seconds_bucket",
    "vllm:prefix_cache_hits_total",
    "vllm:prefix_cache_queries_total",
]
GRAPH_WINDOW = '#pctc{"duration":120,"endTime":0}'  # prom_console.js reads the range from the hash
GRAPH_EXPRS = re.compile(r'zgGraph\(\s*"[^"]+",\s*(\[[^\]]*\]|"[^"]*")')


def graph_exprs(served: str) -> list[str]:
    """The PromQL of every zgGraph(...) call in a served console page (JSON-compatible literals)."""
    exprs: list[str] = []
    for literal in GRAPH_EXPRS.findall(served):
        value = json.loads(literal)
        exprs.extend(value if isinstance(value, list) else [value])
    return exprs


def finite_values(result: list[dict[str, Any]]) -> list[float]:
    values = [float(r["value"][1]) for r in result if "value" in r]
    values += [float(v[1]) for r in result for v in r.get("values", [])]
    return [v for v in values if math.isfinite(v)]


def wait_for_series(stack: Stack, exprs: list[str], timeout_s: float) -> dict[str, list[float]]:
    """Poll until every expression has at least one finite value; return the last values."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = {e: finite_values(prom_api(stack, "query", query=e)["result"]) for e in exprs}
        missing = [e for e, values in found.items() if not values]
        if not missing:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"no data after {timeout_s} s for: {missing}\n{stack.tail_logs()}")
        time.sleep(1)


def dashboard_problems(stack: Stack, page: str, png: Path) -> list[str]:
    """What is wrong with a console dashboard as served and as drawn; [] when it shows data."""
    url = f"{stack.prometheus_url}/consoles/{page}"
    with urllib.request.urlopen(url, timeout=10) as resp:
        served = resp.read().decode()
    problems = []
    if "error executing template" in served.lower():
        problems.append("template error")
    if 'class="zg-nodata"' in served:
        problems.append("a value or table found no data")
    shown = inspect_page(url + GRAPH_WINDOW, height=1600, wait_ms=5000)
    problems += [f"script: {e}" for e in shown.script_errors]
    graphs = served.count("zgGraph(") - 1  # the library's definition is one
    exprs = graph_exprs(served)
    if graphs < 1 or len(exprs) < graphs:
        problems.append("no graphs, or a graph whose query this test cannot read")
    end = time.time()
    for expr in exprs:
        data = prom_api(stack, "query_range", query=expr, start=str(end - 60), end=str(end), step="2")
        if not finite_values(data["result"]):
            problems.append(f"graph query without data: {expr}")
    if "prom_graph_error" in shown.dom:
        problems.append("a graph says 'No timeseries returned' or 'Error loading data'")
    if shown.dom.count("<svg") < graphs or shown.dom.count('class="rickshaw_legend"') < graphs:
        problems.append("a graph drew no lines")
    render_png(url + GRAPH_WINDOW, png, height=1600, wait_ms=5000)
    if size(png) != (1400, 1600) or ink_fraction(png) < 0.05:
        problems.append("the picture is blank or of the wrong size")
    return problems
