"""Safe by default, against a real `zerogap gateway` process over HTTP: without [server].metrics_key
GET /metrics names no tenant (every series' key label is "all", the metric names and other labels
as before) and GET /metrics/backends gives no backend address to a client off the gateway's host;
with it, both are the metrics key's and name each key and address."""

from __future__ import annotations

import json
import socket
import urllib.request
from pathlib import Path
from typing import Any

import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from common.net import free_port
from gateway.endpoints.backends_info import on_loopback
from gateway.tenants.keys.base import KeyLimits
from gateway.tenants.keys.sqlite import KeyStore
from loadgen.metrics_discovery import ask_gateway
from tests.fixtures.upstream import UpstreamServer
from tests.gateway.processes import UNIFIED, GatewayProcess, call, chat, metric_sum, write_config

METRICS = "metrics-exposure-defaults-key-5"
TENANT = "tenant-alpha-7c2e"


def gateway(tmp_path: Path, up: UpstreamServer, server: str = "") -> GatewayProcess:
    port = free_port()
    return GatewayProcess(write_config(tmp_path / "config.toml", port, up.url, {}, server=server), port)


def key_labels(text: str) -> set[str]:
    """Every value of a `key` label on the page."""
    return {s.labels["key"] for f in text_string_to_metric_families(text) for s in f.samples if "key" in s.labels}


@pytest.mark.parametrize("metrics_key", ["", METRICS])
def test_the_metrics_name_tenants_only_behind_the_metrics_key(tmp_path: Path, metrics_key: str) -> None:
    with UpstreamServer(model="m") as up:
        store = KeyStore(tmp_path / "keys.db")
        key = store.create(TENANT, limits=KeyLimits(rpm=1))
        store.close()
        with gateway(tmp_path, up, f'metrics_key = "{metrics_key}"') as gw:
            answers = [chat(gw.url, key), chat(gw.url, key), call(gw.url + "/tokenize", UNIFIED, {"model": "m"})]
            assert [status for status, _ in answers] == [200, 429, 200], answers
            assert call(gw.url + "/v1/models", "zg-no-such-key-0123456789")[0] == 401
            status, text = call(gw.url + "/metrics", metrics_key or None)
            refused = call(gw.url + "/metrics")[0]
    assert status == 200
    shown = "all" if not metrics_key else TENANT
    served = 1 if metrics_key else 2  # the tenant's chat, and (without the key, under the same label) the tokenize
    assert metric_sum(text, "zerogap_requests_total", key=shown, model="m", backend="b0", status="200") == served
    assert metric_sum(text, "zerogap_requests_total", key=shown, model="none", backend="none", status="429") == 1
    assert metric_sum(text, "zerogap_tokens_total", key=shown, model="m", kind="completion") > 0
    assert metric_sum(text, "zerogap_ratelimited_total", key=shown, model="none", limit="rpm") == 1
    assert metric_sum(text, "zerogap_request_duration_seconds_count", model="m", backend="b0", status="200") == 2
    if metrics_key:
        assert refused == 401
        assert key_labels(text) == {TENANT, "unified"}
    else:
        assert refused == 200
        assert key_labels(text) == {"all"}
        assert TENANT not in text and "unified" not in text


def outward_address() -> str | None:
    """An IPv4 address of this host that is not its loopback (None if it has none)."""
    for addresses in psutil.net_if_addrs().values():
        for address in addresses:
            if address.family == socket.AF_INET and not on_loopback(address.address):
                return str(address.address)
    return None


def listing(host: str, port: int, key: str | None = None) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        with urllib.request.urlopen(
            urllib.request.Request(f"http://{host}:{port}/metrics/backends", headers=headers), timeout=10
        ) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


@pytest.mark.parametrize("metrics_key", ["", METRICS])
def test_the_backend_addresses_are_for_the_metrics_key_or_the_gateways_own_host(tmp_path, metrics_key) -> None:
    """Without a metrics key, a client off the gateway's host sees names, models and `up`; one on its
    loopback (the load test beside a gateway from the shipped config.toml) sees the addresses."""
    outward = outward_address()
    if outward is None:
        pytest.fail(
            "this host has no address but its loopback, so no client can come from elsewhere: give it one "
            "(as root: ip addr add 192.0.2.10/32 dev lo) and run the test again"
        )
    with UpstreamServer(model="m") as up:
        with gateway(tmp_path, up, f'host = "0.0.0.0"\nmetrics_key = "{metrics_key}"') as gw:
            from_here = listing("127.0.0.1", gw.port, metrics_key or None)
            from_afar = listing(outward, gw.port, metrics_key or None)
            afar_without_key = listing(outward, gw.port)
            env = {"ZEROGAP_METRICS_KEY": metrics_key}  # the load test asks as its harness does
            harness_here = ask_gateway(f"http://127.0.0.1:{gw.port}/api", "ZEROGAP_METRICS_KEY", 5.0, env)
            harness_afar = ask_gateway(f"http://{outward}:{gw.port}/api", "ZEROGAP_METRICS_KEY", 5.0, env)
    addressed = {"name": "b0", "model": "m", "url": up.url, "metrics_url": up.url + "/metrics", "up": True}
    assert from_here == (200, {"data": [addressed]})
    assert harness_here.urls == [up.url + "/metrics"], harness_here.note
    if metrics_key:
        assert from_afar == (200, {"data": [addressed]})
        assert afar_without_key[0] == 401
        assert harness_afar.urls == [f"http://{outward}:{up.port}/metrics"], harness_afar.note
    else:
        assert from_afar == (200, {"data": [{**addressed, "url": None, "metrics_url": None}]})
        assert str(up.port) not in json.dumps(from_afar[1])
        assert harness_afar.urls == [] and "Set metrics_key there and export it" in harness_afar.note


@pytest.mark.parametrize(
    ("client", "loopback"),
    [("127.0.0.1", True), ("127.8.0.1", True), ("::1", True), ("::ffff:127.0.0.1", True), ("10.0.0.5", False),
     ("192.0.2.2", False), ("::ffff:10.0.0.5", False), ("2001:db8::1", False), (None, False), ("unix", False)],
)  # fmt: skip
def test_which_clients_are_on_the_loopback(client: str | None, loopback: bool) -> None:
    assert on_loopback(client) is loopback
