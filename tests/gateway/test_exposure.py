"""[server].metrics_key: GET /metrics and the backend detail of GET /ready only for that key (not
the unified or admin key); /health and /ready's status stay open for load balancers. Unset: both
open, /metrics names no key (key="all"), and the gateway says so in its log."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.upstream import UpstreamServer
from tests.gateway.helpers import UNIFIED, GatewayServer, auth, chat_body, error_of, get, make_config, metric, post

ADMIN = "admin-exposure-key-42"
METRICS = "metrics-exposure-key-77"


def base_config(tmp_path: Path, upstream_url: str) -> Any:
    return make_config(tmp_path, [("b0", upstream_url, "m")], admin_key=ADMIN)


def with_metrics_key(config: Any) -> Any:
    return config.model_copy(update={"server": config.server.model_copy(update={"metrics_key": METRICS})})


async def test_metrics_needs_the_metrics_key(tmp_path) -> None:
    with UpstreamServer(model="m") as up:
        config = with_metrics_key(base_config(tmp_path, up.url))
        with GatewayServer(config) as gs:
            url = gs.url + "/metrics"
            refused = {
                "none": await get(url),
                "malformed": await get(url, {"Authorization": "Basic " + METRICS}),
                "wrong": await get(url, auth(METRICS + "x")),
                "unified": await get(url, auth(UNIFIED)),
                "admin": await get(url, auth(ADMIN)),
            }
            for what, (status, raw) in refused.items():
                err = error_of(raw)
                assert status == 401 and err["type"] == "authentication_error", what
                assert "[server].metrics_key" in err["message"], (what, err)
                assert b"zerogap_" not in raw
            status, text = await get(url, auth(METRICS))
            assert status == 200 and b"zerogap_requests_total" in text
            assert metric(text, "zerogap_auth_failures_total", reason="missing") == 1
            assert metric(text, "zerogap_auth_failures_total", reason="malformed") == 1
            assert metric(text, "zerogap_auth_failures_total", reason="invalid") == 3
            assert (await get(gs.url + "/health")) == (200, b'{"status":"ok"}')


async def test_ready_shows_the_detail_only_to_the_metrics_key(tmp_path) -> None:
    with UpstreamServer(model="m") as up:
        config = with_metrics_key(base_config(tmp_path, up.url))
        with GatewayServer(config) as gs:
            url = gs.url + "/ready"
            for headers in (None, auth(UNIFIED), auth(ADMIN), auth("wrong-key-of-some-length")):
                status, raw = await get(url, headers)
                assert status == 200 and json.loads(raw) == {"status": "ready"}, headers
            status, raw = await get(url, auth(METRICS))
            detail = json.loads(raw)
            assert status == 200 and detail["backends"]["b0"]["up"] is True and detail["key_store"] == "up"

            up.behavior.healthy = False  # no backend: 503 for the load balancer, key or not
            gs.gw.router.backends[0].healthy = False
            status, raw = await get(url)
            assert status == 503 and json.loads(raw) == {"status": "not ready: no healthy backend"}
            status, raw = await get(url, auth(METRICS))
            assert status == 503 and json.loads(raw)["backends"]["b0"]["up"] is False


async def test_without_metrics_key_both_are_open_the_metrics_name_no_key_and_the_log_says_so(tmp_path, caplog) -> None:
    caplog.set_level(logging.INFO, logger="zerogap.gateway")
    with UpstreamServer(model="m") as up:
        with GatewayServer(base_config(tmp_path, up.url)) as gs:
            assert (await post(gs.url + "/v1/chat/completions", chat_body(stream=False), auth()))[0] == 200
            status, text = await get(gs.url + "/metrics")
            assert status == 200 and b"zerogap_requests_total" in text
            status, raw = await get(gs.url + "/ready")
            assert status == 200 and "b0" in json.loads(raw)["backends"]
    assert metric(text, "zerogap_requests_total", key="all", status="200") == 1
    assert b'key="unified"' not in text
    said = [r.getMessage() for r in caplog.records if "metrics_key is not set" in r.getMessage()]
    assert len(said) == 1 and 'key="all"' in said[0]


@pytest.mark.parametrize("field", ["api_key", "admin_key"])
def test_metrics_key_must_differ_from_the_other_keys(tmp_path, field) -> None:
    """Checked by the config (common/config/gateway.py): the metrics key opens less than the others,
    so it must not be one of them."""
    config = base_config(tmp_path, "http://127.0.0.1:9")
    same = getattr(config.server, field)
    with pytest.raises(ValueError, match="metrics_key must differ"):
        type(config.server).model_validate({**config.server.model_dump(), "metrics_key": same})
