"""The relay's decisions (gateway/relay/relay.py) against a scripted upstream client, in process: what is
retried and where, what passes through, what a client is told, and what a request is charged."""

from __future__ import annotations

import json

from tests.gateway.helpers import (
    METRICS_KEY,
    GatewayServer,
    auth,
    chat_body,
    error_of,
    events,
    get,
    make_config,
    metric,
    post,
)
from tests.gateway.scripted_upstream import Answer, ScriptedClient, stream

BACKENDS = [("a", "http://10.255.0.1:1", "m"), ("b", "http://10.255.0.2:2", "m"), ("c", "http://10.255.0.3:3", "m")]
VLLM_400 = json.dumps({"error": {"message": "max_tokens is too large", "type": "BadRequestError", "param": None,
                                 "code": 400}}).encode()  # fmt: skip


def gateway(tmp_path, client: ScriptedClient, **settings: object) -> GatewayServer:
    return GatewayServer(make_config(tmp_path, BACKENDS, {"max_retries": 2, **settings}, per_key=True), client=client)


async def metrics_of(gs: GatewayServer) -> bytes:
    return (await get(gs.url + "/metrics", auth(METRICS_KEY)))[1]


def contents(raw: bytes) -> list[str]:
    """The content of each chunk that carries some."""
    found = [json.loads(e) for e in events(raw) if e != "[DONE]"]
    return [c for e in found if "choices" in e for c in [e["choices"][0]["delta"].get("content")] if c]


async def test_a_5xx_before_the_first_byte_is_retried_on_another_backend(tmp_path) -> None:
    client = ScriptedClient(Answer(503, b'{"error": "overloaded"}'), Answer(chunks=stream(3)))
    with gateway(tmp_path, client) as gs:
        status, _, raw = await post(gs.url + "/v1/chat/completions", chat_body(), auth())
        text = await metrics_of(gs)
    assert status == 200 and contents(raw) == [" t0", " t1", " t2"]
    assert len(client.posts) == 2 and client.posts[0] != client.posts[1]
    assert metric(text, "zerogap_retries_total") == 1
    assert metric(text, "zerogap_upstream_errors_total", status="503") == 1


async def test_a_failed_connect_is_retried_on_another_backend(tmp_path) -> None:
    client = ScriptedClient(Answer(connect=True), Answer(chunks=stream(2)))
    with gateway(tmp_path, client) as gs:
        status, _, raw = await post(gs.url + "/v1/chat/completions", chat_body(), auth())
        text = await metrics_of(gs)
    assert status == 200 and contents(raw) == [" t0", " t1"]
    assert len(set(client.posts)) == 2
    assert metric(text, "zerogap_upstream_errors_total", status="connect") == 1


async def test_a_client_error_passes_through_once_and_unchanged(tmp_path) -> None:
    client = ScriptedClient(Answer(400, VLLM_400))
    with gateway(tmp_path, client) as gs:
        status, _, raw = await post(gs.url + "/v1/chat/completions", chat_body(), auth())
    assert status == 400 and error_of(raw)["message"] == "max_tokens is too large"
    assert len(client.posts) == 1  # the client's to fix: never tried elsewhere


async def test_retries_stop_at_max_retries_and_the_client_gets_the_gateways_502(tmp_path) -> None:
    client = ScriptedClient(*(Answer(502, b"<html>internal proxy 10.0.0.7</html>") for _ in range(5)))
    with gateway(tmp_path, client, max_retries=1) as gs:
        status, _, raw = await post(gs.url + "/v1/chat/completions", chat_body(), auth())
    assert status == 502 and len(client.posts) == 2  # the first try and one retry
    message = error_of(raw)["message"]
    assert "answered 502" in message and "10.0.0.7" not in message  # the backend's body goes to the log only


async def test_refused_credentials_are_retried_and_never_shown(tmp_path) -> None:
    client = ScriptedClient(Answer(401, b'{"error": "bad key sk-internal"}'), Answer(chunks=stream(1)))
    with gateway(tmp_path, client) as gs:
        status, _, raw = await post(gs.url + "/v1/chat/completions", chat_body(), auth())
    assert status == 200 and contents(raw) == [" t0"] and len(client.posts) == 2


async def test_a_stream_broken_after_its_first_byte_is_charged_what_was_relayed_and_not_retried(tmp_path) -> None:
    client = ScriptedClient(Answer(chunks=stream(4, ends=False), breaks=True), Answer(chunks=stream(4)))
    with gateway(tmp_path, client) as gs:
        headers = {**auth(), "X-Zerogap-Continue": "off"}  # the client would rather see the break
        status, _, raw = await post(gs.url + "/v1/chat/completions", chat_body(), headers)
        text = await metrics_of(gs)
    assert status == 200 and contents(raw) == [" t0", " t1", " t2", " t3"]
    assert events(raw)[-1] == "[DONE]" and "broke the stream" in json.loads(events(raw)[-2])["error"]["message"]
    assert len(client.posts) == 1  # bytes reached the client: no retry from the start
    assert metric(text, "zerogap_tokens_total", kind="completion") == 4
    assert metric(text, "zerogap_tokens_total", kind="prompt") == 5


async def test_a_broken_stream_is_continued_on_another_backend_from_what_was_relayed(tmp_path) -> None:
    client = ScriptedClient(Answer(chunks=stream(2, ends=False), breaks=True), Answer(chunks=stream(3)))
    with gateway(tmp_path, client) as gs:
        status, _, raw = await post(gs.url + "/v1/chat/completions", chat_body(), auth())
    assert status == 200 and len(set(client.posts)) == 2
    assert contents(raw)[:2] == [" t0", " t1"] and "[DONE]" in events(raw)
    again = client.bodies[1]
    assert again["messages"][-1] == {"role": "assistant", "content": " t0 t1"}  # type: ignore[index]
    assert again.get("continue_final_message") is True


async def test_a_non_streamed_request_is_asked_as_a_stream_and_put_together(tmp_path) -> None:
    client = ScriptedClient(Answer(chunks=stream(3)))
    with gateway(tmp_path, client) as gs:
        status, _, raw = await post(gs.url + "/v1/chat/completions", chat_body(stream=False), auth())
        text = await metrics_of(gs)
    answer = json.loads(raw)
    assert status == 200 and answer["choices"][0]["message"]["content"] == " t0 t1 t2"
    assert answer["usage"]["completion_tokens"] == 3 and client.bodies[0]["stream"] is True
    assert metric(text, "zerogap_tokens_total", kind="completion") == 3
