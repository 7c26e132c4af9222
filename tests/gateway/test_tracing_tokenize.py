"""POST /tokenize and /detokenize are told as completions are: x-request-id and x-zerogap-overhead-ms on
every answer, the request id and the gateway's traceparent sent to the backend, spans (admission, the
upstream call; a refusal names the limit) and a request log line each, whose requests add up to
/admin/usage."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures.otlp import OtlpReceiver
from tests.fixtures.upstream import Behavior, UpstreamServer
from tests.gateway.helpers import auth, get, wait_until
from tests.gateway.test_request_log import FIELDS
from tests.gateway.test_tracing import ADMIN, CLIENT_SPAN, admin_key, by_name, flushed, header, no_secret, post, traced


@pytest.fixture
def otlp() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as receiver:
        yield receiver


def parent(trace: int) -> dict[str, str]:
    return {"traceparent": f"00-{trace:032x}-{CLIENT_SPAN}-01", "x-request-id": f"tok-{trace}"}


async def test_tokenize_and_detokenize_have_spans_a_log_line_and_the_gateways_time(tmp_path: Path, otlp) -> None:
    log = tmp_path / "requests.jsonl"
    with (
        UpstreamServer(Behavior(ttft_s=0.0), model="m") as up,
        traced(tmp_path, [("b0", up.url, "m")], otlp, obs=f'\n[logging]\nrequest_log = "{log}"\n') as gs,
    ):
        secret = await admin_key(gs, {"name": "team-a", "rpm": 2})
        answers = [
            await post(gs.url + "/tokenize", {"model": "m", "prompt": "a b c"}, {**auth(secret), **parent(1)}),
            await post(gs.url + "/detokenize", {"model": "m", "tokens": [1, 2]}, {**auth(secret), **parent(2)}),
            await post(gs.url + "/tokenize", {"model": "m", "prompt": "a"}, {**auth(secret), **parent(3)}),  # rpm
            await post(gs.url + "/tokenize", {"model": "nope", "prompt": "a"}, {**auth(), **parent(4)}),
        ]
        assert [status for status, _, _ in answers] == [200, 200, 429, 404]
        traces = [await flushed(gs, otlp, f"{i:032x}", n) for i, n in ((1, 6), (2, 6), (3, 3), (4, 5))]
        await gs.gw.usage.flush()
        assert await wait_until(lambda: log.exists() and len(log.read_text().splitlines()) == 4)
        status, raw = await get(gs.url + "/admin/usage", auth(ADMIN))
        assert status == 200
        sent = list(up.state.tokenize_headers)
    for i, (_, headers, _) in enumerate(answers, 1):
        assert headers["x-request-id"] == f"tok-{i}" and float(headers["x-zerogap-overhead-ms"]) >= 0
    # the backend was asked under the client's trace, as the child of the gateway's upstream span
    for i, seen in enumerate(sent, 1):
        (upstream,) = by_name(traces[i - 1])["upstream"]
        assert header(seen, "traceparent") == f"00-{i:032x}-{upstream.span_id}-01"
        assert header(seen, "x-request-id") == f"tok-{i}"
    assert len(sent) == 2
    for i, path in ((0, "tokenize"), (1, "detokenize")):
        named = by_name(traces[i])
        (root,) = named[f"{path} m"]
        assert root.kind == "server" and root.parent_id == CLIENT_SPAN
        a = root.attributes
        assert (a["zerogap.key.name"], a["zerogap.backend"], a["http.response.status_code"]) == ("team-a", "b0", 200)
        assert (a["url.path"], a["zerogap.request_id"]) == (f"/{path}", f"tok-{i + 1}")
        assert {s.name for s in traces[i]} == {f"{path} m", "admission", "auth", "limits", "body", "upstream"}
        (upstream,) = named["upstream"]
        assert upstream.kind == "client" and upstream.parent_id == root.span_id and upstream.status == 0
        assert root.start_ns <= upstream.start_ns <= upstream.end_ns <= root.end_ns
    refused = by_name(traces[2])
    (root,) = refused["tokenize none"]  # refused at the headers: the model is not read yet
    assert root.attributes["zerogap.limit"] == "rpm" and root.attributes["error.type"] == "rate_limit_requests"
    assert refused["admission"][0].attributes["zerogap.limit"] == "rpm" and refused["limits"][0].status == 2
    assert "upstream" not in refused
    (root,) = by_name(traces[3])["tokenize unknown"]
    assert root.attributes["error.type"] == "model_not_found" and by_name(traces[3])["body"][0].status == 0
    for spans in traces:
        no_secret(spans, secret, secret[3:])
    lines = {line["request_id"]: line for line in map(json.loads, log.read_text().splitlines())}
    assert all(set(line) == FIELDS for line in lines.values())
    assert [(lines[f"tok-{i}"]["path"], lines[f"tok-{i}"]["status"], lines[f"tok-{i}"]["engine"],
             lines[f"tok-{i}"]["error"]) for i in (1, 2, 3, 4)] == [
        ("/tokenize", 200, "b0", None), ("/detokenize", 200, "b0", None),
        ("/tokenize", 429, "none", "rate_limit_requests"), ("/tokenize", 404, "none", "model_not_found"),
    ]  # fmt: skip
    assert all(lines[f"tok-{i}"]["trace_id"] == f"{i:032x}" for i in (1, 2, 3, 4))
    # the requests the lines say a backend answered are what /admin/usage counts (no tokens)
    answered: dict[tuple[str, str], int] = {}
    for line in lines.values():
        if line["engine"] != "none" and line["status"] == 200:
            answered[(line["key"], line["model"])] = answered.get((line["key"], line["model"]), 0) + 1
    usage = {(r["key"], r["model"]): (r["requests"], r["prompt_tokens"], r["completion_tokens"])
             for r in json.loads(raw)["data"]}  # fmt: skip
    assert usage == {k: (n, 0, 0) for k, n in answered.items()} == {("team-a", "m"): (2, 0, 0)}
