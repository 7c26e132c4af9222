"""One request end to end with vLLM itself (issue 41): the gateway's spans and the replica's
(vLLM's `--otlp-traces-endpoint`, which the tier's shared replica is started with, to the same test
OTLP/HTTP receiver: tests/backends/vllm/pool.py) share one trace id, and vLLM's `llm_request` span is
the child of the gateway's `upstream` span, whose id the gateway's traceparent named. A gateway in
this test's process (tracing on) sits in front of the tier's replica; nothing else is started."""

from __future__ import annotations

import asyncio

import pytest

from tests.backends.vllm.pool import MODEL, Pool
from tests.fixtures.otlp import OtlpReceiver
from tests.gateway.helpers import GatewayServer, auth, make_config
from tests.gateway.helpers import post as apost

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(900)]

BODY = {"model": MODEL, "messages": [{"role": "user", "content": "Say something."}], "max_tokens": 8,
        "temperature": 0, "stream": True}  # fmt: skip


@pytest.fixture
def pool(vllm_pool: Pool) -> Pool:
    return vllm_pool


async def test_vllms_spans_join_the_gateways_trace(pool: Pool, tmp_path) -> None:
    otlp = pool.otlp
    assert isinstance(otlp, OtlpReceiver)
    extra = f'[observability]\notlp_endpoint = "{otlp.url}"\nservice_name = "zerogap-tier"\n'
    config = make_config(tmp_path, [("replica0", pool.engine_url, MODEL)], extra=extra)
    with GatewayServer(config) as gs:
        status, _, raw = await apost(gs.url + "/v1/chat/completions", BODY, {**auth(), "x-request-id": "tier-1"})
        assert status == 200 and raw.rstrip().endswith(b"data: [DONE]"), raw[-300:]
        tracing = gs.gw.observer.tracing
        assert tracing is not None
        await asyncio.to_thread(tracing.flush)
    mine = otlp.wait_for(lambda spans: any(s.attributes.get("zerogap.request_id") == "tier-1" for s in spans))
    (root,) = [s for s in mine if s.attributes.get("zerogap.request_id") == "tier-1"]
    trace_id = root.trace_id
    (upstream,) = [s for s in otlp.of_trace(trace_id) if s.name == "upstream"]

    def vllm_spans(spans: list) -> list:
        return [s for s in spans if s.trace_id == trace_id and s.service != "zerogap-tier"]

    theirs = vllm_spans(otlp.wait_for(lambda spans: bool(vllm_spans(spans)), timeout_s=30))
    assert theirs, f"no span of vLLM's in trace {trace_id}: {[(s.service, s.name) for s in otlp.received()][-10:]}"
    (engine,) = [s for s in theirs if s.name == "llm_request"]
    assert engine.parent_id == upstream.span_id and engine.kind == "server"
    assert "tier-1" in str(engine.attributes.get("gen_ai.request.id"))  # vLLM named it after x-request-id
    assert engine.attributes["gen_ai.usage.completion_tokens"] == root.attributes["gen_ai.usage.output_tokens"] == 8
