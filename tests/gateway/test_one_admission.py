"""One admission for the completion endpoints and POST /tokenize, /detokenize (gateway/tenants/admission.py),
against a real `zerogap gateway` process over HTTP: a tokenize takes from the key's rpm and holds
one of its concurrency slots until it ends, is counted in zerogap_requests_total and
zerogap_request_duration_seconds and in /admin/usage (0 tokens); and a key gets one answer for a
model that is not there and for a model that is not its own."""

from __future__ import annotations

import concurrent.futures
import json
from pathlib import Path
from typing import Any

from common.net import free_port
from gateway.tenants.keys.base import KeyLimits
from gateway.tenants.keys.sqlite import KeyStore
from tests.fixtures.upstream import Behavior, UpstreamServer
from tests.gateway.processes import UNIFIED, GatewayProcess, call, chat, metric_sum, write_config

ADMIN = "admin-one-admission-key-41"
METRICS = "metrics-one-admission-key-77"
PROMPT = {"model": "m", "prompt": "one two three"}


def gateway(tmp_path: Path, up: UpstreamServer, extra: str = "") -> GatewayProcess:
    """A gateway with the metrics key (per-key series) and the admin API over `up` (model m) and
    `extra` backends."""
    port = free_port()
    server = f'admin_key = "{ADMIN}"\nmetrics_key = "{METRICS}"\n'
    config = write_config(tmp_path / "config.toml", port, up.url, {}, server=server)
    config.write_text(config.read_text() + extra)
    return GatewayProcess(config, port)


def new_key(tmp_path: Path, name: str, models: list[str] | None = None, **limits: int) -> str:
    store = KeyStore(tmp_path / "keys.db")
    try:
        return store.create(name, models, KeyLimits(**limits))
    finally:
        store.close()


def tokenize(base: str, key: str, body: dict[str, Any] | None = None, path: str = "/tokenize") -> tuple[int, Any]:
    return call(base + path, key, body if body is not None else PROMPT)


def metrics(base: str) -> str:
    status, text = call(base + "/metrics", METRICS)
    assert status == 200, text
    return str(text)


def test_a_tokenize_takes_from_the_keys_rpm(tmp_path) -> None:
    with UpstreamServer(model="m") as up:
        key = new_key(tmp_path, "three-a-minute", rpm=3)
        with gateway(tmp_path, up) as gw:
            answers = [
                tokenize(gw.url, key),
                tokenize(gw.url, key, {"model": "m", "tokens": [1, 2]}, "/detokenize"),
                tokenize(gw.url, key, path="/api/tokenize"),
                tokenize(gw.url, key),  # the (rpm+1)th
                chat(gw.url, key),  # the same bucket
            ]
            statuses = [status for status, _ in answers]
            assert statuses == [200, 200, 200, 429, 429], answers
            assert answers[3][1]["error"]["code"] == "rate_limit_requests", answers[3]
            text = metrics(gw.url)
    assert metric_sum(text, "zerogap_ratelimited_total", key="three-a-minute", limit="rpm") == 2
    assert up.state.num_tokenize == 3


def test_a_held_tokenize_holds_a_concurrency_slot_until_it_ends(tmp_path) -> None:
    with UpstreamServer(Behavior(hold_tokenize=True), model="m") as up:
        key = new_key(tmp_path, "one-at-a-time", max_concurrency=1)
        with gateway(tmp_path, up) as gw, concurrent.futures.ThreadPoolExecutor(1) as pool:
            held = pool.submit(tokenize, gw.url, key)
            assert up.wait_for(lambda u: u.state.num_tokenize == 1, timeout_s=10)  # it is at the engine
            refused = [tokenize(gw.url, key), chat(gw.url, key)]
            up.release_tokenize()
            assert held.result(timeout=10)[0] == 200
            after = tokenize(gw.url, key)  # its slot was given back when it ended
    for status, body in refused:
        assert status == 429 and body["error"]["code"] == "concurrency_limit", (status, body)
    assert after[0] == 200, after
    assert up.state.num_tokenize == 2


def test_a_tokenize_is_counted_in_the_metrics_and_the_usage(tmp_path) -> None:
    with UpstreamServer(model="m") as up:
        key = new_key(tmp_path, "counter")
        with gateway(tmp_path, up) as gw:
            assert tokenize(gw.url, key)[0] == 200
            assert tokenize(gw.url, key, {"model": "m", "tokens": [0, 1]}, "/detokenize")[0] == 200
            assert tokenize(gw.url, key, {"prompt": "no model"})[0] == 400
            text = metrics(gw.url)
            status, usage = call(gw.url + "/admin/usage", ADMIN)
    ok = {"model": "m", "backend": "b0", "key": "counter", "status": "200"}
    assert metric_sum(text, "zerogap_requests_total", **ok) == 2
    assert metric_sum(text, "zerogap_requests_total", model="none", backend="none", key="counter", status="400") == 1
    assert metric_sum(text, "zerogap_request_duration_seconds_count", model="m", backend="b0", status="200") == 2
    assert status == 200, usage
    rows = [row for row in usage["data"] if row["key"] == "counter"]
    assert rows == [{"key": "counter", "model": "m", "requests": 2, "prompt_tokens": 0, "completion_tokens": 0}]


def test_a_model_that_is_not_the_keys_is_answered_as_one_that_is_not_there(tmp_path) -> None:
    """'other' is served (by b1) but not this key's; 'ghost' is served by no one: the same 404,
    the same body but for the name (both five letters: the same length too), the same label."""
    with UpstreamServer(model="m") as up, UpstreamServer(model="other") as up_other:
        key = new_key(tmp_path, "only-m", models=["m"])
        extra = f'[[backends]]\nname = "b1"\nurl = "{up_other.url}"\nmodel = "other"\n'
        with gateway(tmp_path, up, extra) as gw:
            seen: dict[str, list[tuple[int, str]]] = {"other": [], "ghost": []}
            for model in seen:
                bodies = {
                    "/v1/chat/completions": {"model": model, "messages": [{"role": "user", "content": "hi"}]},
                    "/api/v1/completions": {"model": model, "prompt": "hi"},
                    "/tokenize": {"model": model, "prompt": "hi"},
                    "/detokenize": {"model": model, "tokens": [1]},
                }
                for path, body in bodies.items():
                    status, answer = call(gw.url + path, key, body)
                    seen[model].append((status, json.dumps(answer).replace(model, "MODEL")))
            listed = call(gw.url + "/v1/models", key)[1]
            unified = call(gw.url + "/tokenize", UNIFIED, {"model": "other", "prompt": "hi"})[0]
            text = metrics(gw.url)
    assert seen["other"] == seen["ghost"]
    status, body = seen["other"][0]
    error = json.loads(body)["error"]
    assert status == 404 and error["code"] == "model_not_found" and error["param"] == "model", body
    assert "GET /v1/models" in error["message"]
    assert [entry["id"] for entry in listed["data"]] == ["m"]
    assert unified == 200  # the model is there, for a key that may use it
    assert metric_sum(text, "zerogap_requests_total", key="only-m", model="unknown", status="404") == 8
    assert metric_sum(text, "zerogap_requests_total", key="only-m", model="other") == 0
    assert metric_sum(text, "zerogap_requests_total", key="only-m", model="ghost") == 0
    assert up.requests == [] and up_other.requests == [] and up_other.state.num_tokenize == 1
