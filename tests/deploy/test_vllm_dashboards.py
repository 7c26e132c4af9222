"""The backend dashboards against a real vLLM (the CPU build, a tiny local model, started by
`zerogap backends up` behind the gateway): every vllm:* series they read exists under the name
this vLLM exports, the Backends page shows data, and the engine panels of Grafana return data.
GPU utilization has no source here (no GPU, no DCGM, no sim): that tile says so."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.backends.vllm.pool import MODEL, Pool, post
from tests.deploy.checks import ENGINE_SERIES, dashboard_problems, finite_values, wait_for_series
from tests.deploy.paths import grafana_panels
from tests.deploy.stack import Stack, prom_api, start_prometheus

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(900)]

# Engine series plus the recording rules built on them.
VLLM_SERIES = [
    *ENGINE_SERIES,
    "zerogap:backend_generation_tokens:rate15s",
    "zerogap:backend_ttft_seconds:quantile15s",
]
CHAT = {"messages": [{"role": "user", "content": "Say something about tokens."}]}
ENGINE_PANELS = ["Running requests", "Waiting requests", "KV cache usage", "Output tokens per second (engines)"]


@pytest.fixture(scope="module")
def vllm_stack(vllm_pool: Pool, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    pool = vllm_pool  # the tier's one replica (tests/conftest.py)
    stack = Stack(tmp_path_factory.mktemp("deploy-vllm") / "prometheus")
    stack.workdir.mkdir()
    stack.gateway_port = pool.gateway_port
    stack.sims = {"replica0": pool.engine_port}  # the name the gateway gives the launcher's replica
    try:
        start_prometheus(stack)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # a few requests per scrape, for rates and quantiles
            post(pool.gateway_url + "/v1/chat/completions", {"model": MODEL, "max_tokens": 16, **CHAT})
            if all(finite_values(prom_api(stack, "query", query=s)["result"]) for s in VLLM_SERIES):
                break
        yield stack
    finally:
        stack.stop()


def test_vllm_exports_every_series_the_dashboards_read(vllm_stack: Stack) -> None:
    wait_for_series(vllm_stack, VLLM_SERIES, timeout_s=10)
    up = prom_api(vllm_stack, "query", query="zerogap_backend_up")["result"]
    assert [(r["metric"]["backend"], r["value"][1]) for r in up] == [("replica0", "1")]


def test_backends_page_shows_vllm(vllm_stack: Stack, tmp_path: Path) -> None:
    with urllib.request.urlopen(f"{vllm_stack.prometheus_url}/consoles/backends.html", timeout=10) as resp:
        assert "<th>replica0</th>" in resp.read().decode()
    assert dashboard_problems(vllm_stack, "backends.html", tmp_path / "backends.png") == []


@pytest.mark.parametrize("title", ENGINE_PANELS)
def test_grafana_engine_panels_read_vllm(vllm_stack: Stack, title: str) -> None:
    (panel,) = [p for p in grafana_panels() if p["title"] == title]
    end = time.time()
    for target in panel["targets"]:
        data = prom_api(vllm_stack, "query_range", query=target["expr"], start=str(end - 60), end=str(end), step="2")
        assert finite_values(data["result"]), target["expr"]
