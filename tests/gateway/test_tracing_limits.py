"""The span of a request refused by a key's limit names that limit (zerogap.limit) and the admission step
that refused it: tpm at the tpm reservation, after the body; max_concurrency at the headers."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from tests.fixtures.otlp import OtlpReceiver
from tests.fixtures.upstream import Behavior, UpstreamServer
from tests.gateway.helpers import auth, chat_body, wait_until
from tests.gateway.test_tracing import CLIENT_SPAN, admin_key, by_name, flushed, post, traced


@pytest.fixture
def otlp() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as receiver:
        yield receiver


def parent(trace: int) -> dict[str, str]:
    return {"traceparent": f"00-{trace:032x}-{CLIENT_SPAN}-01"}


async def test_tpm_and_concurrency_refusals_name_their_limit_and_step(tmp_path, otlp) -> None:
    with (
        UpstreamServer(Behavior(ttft_s=1.0, num_output_tokens=2), model="m") as up,
        traced(tmp_path, [("b0", up.url, "m")], otlp) as gs,
    ):
        url = gs.url + "/v1/chat/completions"
        for i, limits in enumerate(({"tpm": 100}, {"max_concurrency": 1})):
            key = await admin_key(gs, {"name": f"team-{i}", **limits})
            held = asyncio.create_task(post(url, chat_body(max_tokens=60), auth(key)))
            # the first holds its tokens or the key's one slot (its upstream waits 1 s before its first token)
            assert await wait_until(lambda i=i: len(up.requests) > i)
            status, _, raw = await post(url, chat_body(max_tokens=60), {**auth(key), **parent(i + 1)})
            assert status == 429 and (await held)[0] == 200, raw
        tpm_spans, concurrency_spans = await flushed(gs, otlp, f"{1:032x}", 6), await flushed(gs, otlp, f"{2:032x}", 4)
    for spans, limit, step, key in ((tpm_spans, "tpm", "tpm", "team-0"),
                                    (concurrency_spans, "concurrency", "limits", "team-1")):  # fmt: skip
        named = by_name(spans)
        (root,) = [s for s in spans if s.kind == "server"]
        assert root.attributes["zerogap.limit"] == limit and root.attributes["zerogap.key.name"] == key
        (admission,) = named["admission"]
        assert admission.attributes["zerogap.limit"] == limit and admission.status == 2
        assert [s.name for s in spans if s.status == 2 and s.parent_id == admission.span_id] == [step]
    assert {s.name for s in tpm_spans} == {"chat m", "admission", "auth", "limits", "body", "tpm"}
