"""The body rules of gateway/endpoints/request.py through a real gateway and a real upstream: max_tokens_limit,
max_tokens sent when the request names none, dropped fields, usage asked on every chunk."""

from __future__ import annotations

import json

import pytest

from tests.fixtures.upstream import Behavior, UpstreamServer
from tests.gateway.helpers import GatewayServer, auth, chat_body, error_of, events, make_config, post

LIMIT = 50
BOTH = {"include_usage": True, "continuous_usage_stats": True}


@pytest.fixture
def gateway(tmp_path):
    with UpstreamServer(Behavior(num_output_tokens=5), model="m") as up:
        settings = {"max_tokens_limit": LIMIT, "default_max_tokens": 4096}
        with GatewayServer(make_config(tmp_path, [("b0", up.url, "m")], settings)) as gs:
            yield gs, up


def chunks(raw: bytes) -> list[dict]:
    return [json.loads(e) for e in events(raw) if e != "[DONE]"]


async def test_a_request_above_max_tokens_limit_is_a_400_naming_the_limit(gateway) -> None:
    gs, up = gateway
    url = gs.url + "/v1/chat/completions"
    for field in ("max_tokens", "max_completion_tokens"):
        status, _, raw = await post(url, {**chat_body(stream=False), field: LIMIT + 1}, auth())
        err = error_of(raw)
        assert status == 400 and (err["param"], err["code"]) == (field, "max_tokens_above_limit")
        assert f"at most {LIMIT} ([gateway].max_tokens_limit)" in err["message"]
    assert up.requests == []
    status, _, _ = await post(url, chat_body(stream=False, max_tokens=LIMIT), auth())
    assert status == 200 and up.requests[-1].body["max_tokens"] == LIMIT


async def test_the_upstream_gets_max_tokens_no_priority_and_usage_on_every_chunk(gateway) -> None:
    gs, up = gateway
    body = chat_body(stream=True, priority=-1000)  # no max_tokens: the engine would allow its whole context
    status, _, raw = await post(gs.url + "/v1/chat/completions", body, auth())
    assert status == 200
    seen = up.requests[-1].body
    assert seen["max_tokens"] == LIMIT and "priority" not in seen and seen["stream_options"] == BOTH
    # the client asked for no usage and sees none
    assert all(c.get("usage") is None for c in chunks(raw)) and any(c["choices"] for c in chunks(raw))


async def test_the_client_sees_only_the_usage_it_asked_for(gateway) -> None:
    gs, up = gateway
    url = gs.url + "/v1/completions"
    body = {"model": "m", "prompt": "a b c", "stream": True, "max_tokens": 5}
    final_only = {**body, "stream_options": {"include_usage": True}}
    status, _, raw = await post(url, final_only, auth())
    assert status == 200 and up.requests[-1].body["stream_options"] == BOTH
    with_usage = [c for c in chunks(raw) if c.get("usage")]
    assert len(with_usage) == 1 and with_usage[0]["choices"] == []  # the final usage chunk only

    every = {**body, "stream_options": BOTH}
    status, _, raw = await post(url, every, auth())
    assert status == 200
    assert all(c.get("usage") for c in chunks(raw))  # asked for usage on every chunk: all kept
