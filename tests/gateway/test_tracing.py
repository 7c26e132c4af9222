"""Traces over OTLP ([observability]): a real gateway exports to a test OTLP/HTTP receiver the
spans of a streamed, a retried and a refused request, with the GenAI attributes, the key's name
(never its secret), TTFT and the limit that refused; every upstream request carries the gateway's
traceparent (naming its attempt's span) and the request id."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.fixtures.otlp import OtlpReceiver, Span, SpanStore
from tests.fixtures.upstream import Behavior, UpstreamServer
from tests.gateway.helpers import UNIFIED, GatewayServer, auth, chat_body, events, make_config
from tests.gateway.helpers import post as post_any

ADMIN = "admin-tracing-key-0123456"
CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"


@pytest.fixture
def otlp() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as receiver:
        yield receiver


def traced(tmp_path: Path, backends: list[tuple[str, str, str]], otlp: OtlpReceiver, obs: str = "",
           gateway: dict[str, Any] | None = None) -> GatewayServer:  # fmt: skip
    extra = f'[observability]\notlp_endpoint = "{otlp.url}"\n{obs}'
    return GatewayServer(make_config(tmp_path, backends, gateway=gateway, extra=extra, admin_key=ADMIN))


async def flushed(gs: GatewayServer, otlp: SpanStore, trace_id: str, num_spans: int) -> list[Span]:
    tracing = gs.gw.observer.tracing
    assert tracing is not None
    await asyncio.to_thread(tracing.flush)
    otlp.wait_for(lambda spans: len([s for s in spans if s.trace_id == trace_id]) >= num_spans)
    return otlp.of_trace(trace_id)


async def post(url: str, body: Any, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
    """The answer, its header names in lower case."""
    status, got, raw = await post_any(url, body, headers)
    return status, {k.lower(): v for k, v in got.items()}, raw


def header(seen_headers: dict[str, str], name: str) -> str | None:
    return next((v for k, v in seen_headers.items() if k.lower() == name), None)


def by_name(spans: list[Span]) -> dict[str, list[Span]]:
    out: dict[str, list[Span]] = {}
    for s in spans:
        out.setdefault(s.name, []).append(s)
    return out


def no_secret(spans: list[Span], *secrets: str) -> None:
    text = json.dumps([s.attributes for s in spans]) + " ".join(s.name for s in spans)
    for secret in secrets:
        assert secret not in text


async def test_a_streamed_request_continues_the_clients_trace_with_one_span_per_step(tmp_path, otlp) -> None:
    with (
        UpstreamServer(Behavior(ttft_s=0.05, interval_s=0.005, num_output_tokens=5), model="m") as up,
        traced(tmp_path, [("b0", up.url, "m")], otlp) as gs,
    ):
        headers = {**auth(), "traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01", "x-request-id": "client-id-1"}
        status, resp_headers, raw = await post(gs.url + "/v1/chat/completions", chat_body(), headers)
        assert status == 200 and events(raw)[-1] == "[DONE]"
        assert resp_headers["x-request-id"] == "client-id-1"
        overhead_ms = float(resp_headers["x-zerogap-overhead-ms"])
        assert 0 <= overhead_ms < 50.0  # the upstream's 50 ms before its first token are not the gateway's
        spans = await flushed(gs, otlp, CLIENT_TRACE, 9)
    named = by_name(spans)
    (root,) = named["chat m"]
    assert root.kind == "server" and root.parent_id == CLIENT_SPAN and root.service == "zerogap-gateway"
    a = root.attributes
    assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.request.model"] == "m"
    assert (a["gen_ai.usage.input_tokens"], a["gen_ai.usage.output_tokens"]) == (2, 5)
    assert a["gen_ai.response.finish_reasons"] == ["stop"]
    assert a["zerogap.key.name"] == "unified" and a["zerogap.request_id"] == "client-id-1"
    assert a["http.response.status_code"] == 200 and a["zerogap.backend"] == "b0"
    assert a["zerogap.ttft_ms"] >= 50.0 and a["zerogap.overhead_ms"] == pytest.approx(overhead_ms, abs=0.01)
    assert a["zerogap.retries"] == 0 and a["zerogap.continuations"] == 0
    for name in ("admission", "route", "upstream", "first_byte", "stream"):
        (span,) = named[name]
        assert span.parent_id == root.span_id and root.start_ns <= span.start_ns <= span.end_ns <= root.end_ns, name
    assert {s.name for s in spans if s.parent_id == named["admission"][0].span_id} == {"auth", "limits", "body"}
    assert named["route"][0].attributes["zerogap.route.policy"] == "least_load"
    (upstream,) = named["upstream"]
    assert upstream.kind == "client" and upstream.attributes["zerogap.attempt.kind"] == "first"
    assert [e[0] for e in upstream.events] == ["response_head", "first_byte"]
    assert named["stream"][0].attributes["gen_ai.response.finish_reasons"] == ["stop"]
    # the upstream was asked under the client's trace, as the child of the gateway's attempt span
    (seen,) = up.requests
    assert header(seen.headers, "traceparent") == f"00-{CLIENT_TRACE}-{upstream.span_id}-01"
    assert header(seen.headers, "x-request-id") == "client-id-1"
    no_secret(spans, UNIFIED)


async def test_a_retried_request_has_a_span_per_attempt_and_each_upstream_its_own_parent(tmp_path, otlp) -> None:
    bad, good = Behavior(fail_status=503), Behavior(num_output_tokens=3)
    with (
        UpstreamServer(bad, model="m") as b0,
        UpstreamServer(good, model="m") as b1,
        traced(tmp_path, [("b0", b0.url, "m"), ("b1", b1.url, "m")], otlp, gateway={"routing": "round_robin"}) as gs,
    ):  # round robin: the first request goes to b0 first
        body = chat_body(stream=False, max_tokens=2)
        status, resp_headers, raw = await post(gs.url + "/v1/chat/completions", body, auth())
        assert status == 200, raw
        request_id = resp_headers["x-request-id"]
        assert len(request_id) == 32 and float(resp_headers["x-zerogap-overhead-ms"]) >= 0
        trace_id = header(b1.requests[0].headers, "traceparent").split("-")[1]  # type: ignore[union-attr]
        spans = await flushed(gs, otlp, trace_id, 10)
    named = by_name(spans)
    (root,) = named["chat m"]
    assert root.parent_id == "" and root.attributes["zerogap.retries"] == 1
    assert root.attributes["zerogap.backend"] == "b1"
    assert root.attributes["gen_ai.response.finish_reasons"] == ["length"]
    assert root.attributes["gen_ai.usage.output_tokens"] == 2 and root.attributes["gen_ai.request.max_tokens"] == 2
    first, second = sorted(named["upstream"], key=lambda s: s.start_ns)
    assert first.attributes["zerogap.backend"] == "b0" and first.attributes["zerogap.attempt.kind"] == "first"
    assert first.attributes["http.response.status_code"] == 503 and first.attributes["error.type"] == "503"
    assert first.status == 2  # ERROR
    assert second.attributes["zerogap.backend"] == "b1" and second.attributes["zerogap.attempt.kind"] == "retry"
    assert second.attributes["zerogap.attempt.outcome"] == "ok" and second.status == 0
    assert [r.attributes["zerogap.backend"] for r in sorted(named["route"], key=lambda s: s.start_ns)] == ["b0", "b1"]
    for upstream, span in ((b0, first), (b1, second)):
        (seen,) = upstream.requests
        assert header(seen.headers, "traceparent") == f"00-{trace_id}-{span.span_id}-01"
        assert header(seen.headers, "x-request-id") == request_id


async def admin_key(gs: GatewayServer, body: dict[str, Any]) -> str:
    async with aiohttp.ClientSession() as s, s.post(gs.url + "/admin/keys", json=body, headers=auth(ADMIN)) as r:
        assert r.status == 201, await r.text()
        key: str = (await r.json())["key"]
        return key


async def test_a_refused_request_names_the_limit_and_the_key_never_its_secret(tmp_path, otlp) -> None:
    with (
        UpstreamServer(Behavior(num_output_tokens=2), model="m") as up,
        traced(tmp_path, [("b0", up.url, "m")], otlp) as gs,
    ):
        secret = await admin_key(gs, {"name": "team-a", "rpm": 1})
        assert (await post(gs.url + "/v1/chat/completions", chat_body(), auth(secret)))[0] == 200
        headers = {**auth(secret), "traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"}
        status, resp_headers, _ = await post(gs.url + "/v1/chat/completions", chat_body(), headers)
        assert status == 429 and resp_headers["x-request-id"] and float(resp_headers["x-zerogap-overhead-ms"]) >= 0
        spans = await flushed(gs, otlp, CLIENT_TRACE, 4)
        assert len(up.requests) == 1
    named = by_name(spans)
    (root,) = named["chat none"]  # refused at the headers: the model is not read yet
    a = root.attributes
    assert a["http.response.status_code"] == 429 and a["zerogap.limit"] == "rpm"
    assert a["error.type"] == "rate_limit_requests" and a["zerogap.key.name"] == "team-a"
    (admission,) = named["admission"]
    assert admission.attributes["zerogap.limit"] == "rpm" and admission.status == 2
    (limits,) = named["limits"]
    assert limits.parent_id == admission.span_id and limits.status == 2  # the step that refused
    assert "upstream" not in named and "route" not in named
    no_secret(spans, secret, secret[3:])


async def test_sampling_is_by_ratio_for_new_traces_and_the_parents_for_continued_ones(tmp_path, otlp) -> None:
    with (
        UpstreamServer(Behavior(num_output_tokens=2), model="m") as up,
        traced(tmp_path, [("b0", up.url, "m")], otlp, obs="sample_ratio = 0.0\n") as gs,
    ):
        assert (await post(gs.url + "/v1/chat/completions", chat_body(), auth()))[0] == 200
        unsampled = header(up.requests[0].headers, "traceparent")
        assert unsampled is not None and unsampled.endswith("-00")  # vLLM records none either
        not_sampled_parent = {**auth(), "traceparent": f"00-{'1' * 32}-{CLIENT_SPAN}-00"}
        assert (await post(gs.url + "/v1/chat/completions", chat_body(), not_sampled_parent))[0] == 200
        sampled_parent = {**auth(), "traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"}
        assert (await post(gs.url + "/v1/chat/completions", chat_body(), sampled_parent))[0] == 200
        assert header(up.requests[1].headers, "traceparent").startswith(f"00-{'1' * 32}-")  # type: ignore[union-attr]
        spans = await flushed(gs, otlp, CLIENT_TRACE, 9)
    assert {s.trace_id for s in otlp.received()} == {CLIENT_TRACE}  # only the trace whose parent was sampled
    assert len(spans) == 9


async def test_a_client_trace_is_not_continued_when_turned_off(tmp_path, otlp) -> None:
    with (
        UpstreamServer(Behavior(num_output_tokens=2), model="m") as up,
        traced(tmp_path, [("b0", up.url, "m")], otlp, obs="continue_client_trace = false\n") as gs,
    ):
        headers = {**auth(), "traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"}
        assert (await post(gs.url + "/v1/chat/completions", chat_body(), headers))[0] == 200
        sent = header(up.requests[0].headers, "traceparent")
        assert sent is not None and CLIENT_TRACE not in sent
        spans = await flushed(gs, otlp, sent.split("-")[1], 9)
    assert all(s.parent_id != CLIENT_SPAN for s in spans)


@pytest.mark.parametrize(
    ("client_id", "kept"),
    [("abc-123_X.y:z@w/v+u=t", True), ("x" * 128, True), ("x" * 129, False), ("bad id", False), ("é", False)],
)
async def test_without_tracing_the_request_id_is_bounded_and_a_client_traceparent_passes(
    tmp_path, client_id: str, kept: bool
) -> None:
    with (
        UpstreamServer(Behavior(num_output_tokens=2), model="m") as up,
        GatewayServer(make_config(tmp_path, [("b0", up.url, "m")])) as gs,
    ):
        assert gs.gw.observer.tracing is None
        traceparent = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"
        headers = {**auth(), "x-request-id": client_id, "traceparent": traceparent}
        status, resp_headers, _ = await post(gs.url + "/v1/chat/completions", chat_body(stream=False), headers)
        assert status == 200
        (seen,) = up.requests
    rid = resp_headers["x-request-id"]
    assert (rid == client_id) is kept and header(seen.headers, "x-request-id") == rid
    if not kept:
        assert len(rid) == 32 and all(c in "0123456789abcdef" for c in rid)
    assert header(seen.headers, "traceparent") == traceparent  # an engine that traces joins the client's trace
