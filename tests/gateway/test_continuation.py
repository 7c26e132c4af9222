"""A stream that outlives its backend (gateway/relay/continuation.py, resume.py): broken after its first
token, it goes on at another backend from the text relayed so far, and the client reads one
stream. Real gateway over HTTP; fixture upstreams that continue their answer (t0, t1, ...) from
the text they are given, as vLLM does with continue_final_message, so every word can be checked."""

from __future__ import annotations

import asyncio
import json

from tests.fixtures.upstream import Behavior, UpstreamServer
from tests.gateway.faults import Seen, one, session, stream_body, usage_of
from tests.gateway.helpers import GatewayServer, auth, get, make_config, metric, post
from tests.gateway.test_usage_charged import ADMIN, charged, new_key

WORDS = [f"t{i}" for i in range(48)]
QUIET = {"outlier_consecutive_errors": 0, "outlier_interval_s": 3600, "max_retries": 4}


async def many(url: str, body: dict, num: int, key: str, concurrency: int = 16) -> list[Seen]:
    gate = asyncio.Semaphore(concurrency)

    async def bounded() -> Seen:
        async with gate:
            return await one(s, url, body, 30, key)

    async with session() as s:
        return await asyncio.gather(*(bounded() for _ in range(num)))


async def test_a_noisy_backend_cuts_30_percent_and_every_word_arrives_once(tmp_path) -> None:
    """600 streams were 95 cut before; now none: each word once and in order, one finish, one
    [DONE], the same id on every chunk, and the key charged what was relayed."""
    noisy, good = Behavior(interval_s=0.002, cut_rate=0.3), Behavior(interval_s=0.002)
    with UpstreamServer(noisy, model="m") as bad, UpstreamServer(good, model="m") as ok:
        config = make_config(tmp_path, [("bad", bad.url, "m"), ("ok", ok.url, "m")], QUIET, admin_key=ADMIN)
        with GatewayServer(config) as gs:
            key = new_key(gs, "team")
            body = stream_body(48, stream_options={"include_usage": True})
            seen = await many(gs.url, body, 200, key)
            row = await charged(gs, "team", 200)
            _, text = await get(gs.url + "/metrics")
    cut = [r for r in seen if r.words != WORDS or not r.finished]
    assert not cut, [r.raw[-300:] for r in cut[:3]]
    for r in seen:
        chunks = [json.loads(p[6:]) for p in r.raw.split(b"\n\n") if p.startswith(b"data: {")]
        assert len({c["id"] for c in chunks}) == 1 and len({c["created"] for c in chunks}) == 1
        reasons = [ch.get("finish_reason") for c in chunks for ch in c["choices"] if ch.get("finish_reason")]
        roles = [ch for c in chunks for ch in c["choices"] if "role" in (ch.get("delta") or {})]
        assert len(reasons) == 1 and len(roles) == 1 and r.raw.count(b"[DONE]") == 1
        assert chunks[-1]["usage"]["completion_tokens"] == 48  # the whole answer, across backends
    continued = metric(text, "zerogap_continuations_total", reason="broken", outcome="continued")
    broken_at_bad = sum(1 for s in bad.requests if s.disconnected)
    assert continued == broken_at_bad > 0
    assert row["completion_tokens"] == 200 * 48  # charged once, as if nothing broke
    prompt_once = usage_of(seen[0].raw)[0]
    assert row["prompt_tokens"] == 200 * prompt_once  # the continuations' prefill is not the tenant's
    assert metric(text, "zerogap_continuation_prompt_tokens_total") > continued * prompt_once


async def test_a_completions_stream_goes_on_from_its_prompt_and_text(tmp_path) -> None:
    """The request asks the fixture to cut its first answer after 5 tokens (a continuation is not cut)."""
    with UpstreamServer(model="m") as a, UpstreamServer(model="m") as b:
        with GatewayServer(make_config(tmp_path, [("a", a.url, "m"), ("b", b.url, "m")], QUIET)) as gs:
            body = {"model": "m", "prompt": "say words", "max_tokens": 12, "stream": True,
                    "fixture": {"close_after_tokens": 5}}  # fmt: skip
            status, _, raw = await post(gs.url + "/v1/completions", body, auth())
    assert status == 200 and Seen(status, raw, 0, 0).words == WORDS[:12]
    [first], [second] = sorted([a.requests, b.requests], key=lambda r: r[0].arrived_wall)
    assert first.body["prompt"] == "say words" and first.disconnected
    assert second.body["prompt"] == "say words t0 t1 t2 t3 t4" and second.body["max_tokens"] == 7


async def test_a_stream_no_backend_can_continue_ends_with_the_error_event_and_is_charged_what_came(tmp_path) -> None:
    with UpstreamServer(Behavior(close_after_tokens=10), model="m") as only:
        config = make_config(tmp_path, [("only", only.url, "m")], QUIET, admin_key=ADMIN)
        with GatewayServer(config) as gs:
            key = new_key(gs, "alone")
            [r] = await many(gs.url, stream_body(48), 1, key)
            row = await charged(gs, "alone")
            _, text = await get(gs.url + "/metrics")
    assert r.status == 200 and r.words == WORDS[:10] and r.error is not None and r.error["code"] == 502
    assert row["completion_tokens"] == 10
    assert metric(text, "zerogap_continuations_total", outcome="failed") == 1


async def test_n2_streams_are_not_continued(tmp_path) -> None:
    with UpstreamServer(model="m") as a, UpstreamServer(model="m") as b:
        with GatewayServer(make_config(tmp_path, [("a", a.url, "m"), ("b", b.url, "m")], QUIET)) as gs:
            async with session() as s:
                r = await one(s, gs.url, stream_body(48, n=2, fixture={"close_after_tokens": 6}))
            _, text = await get(gs.url + "/metrics")
    assert r.error is not None and len(a.requests) + len(b.requests) == 1
    assert metric(text, "zerogap_continuations_total", outcome="not_continued") == 1


async def test_a_client_may_opt_out_with_a_header(tmp_path) -> None:
    with UpstreamServer(model="m") as a, UpstreamServer(model="m") as b:
        with GatewayServer(make_config(tmp_path, [("a", a.url, "m"), ("b", b.url, "m")], QUIET)) as gs:
            body = stream_body(48, fixture={"close_after_tokens": 6})
            status, _, raw = await post(gs.url + "/v1/chat/completions", body, {**auth(), "X-Zerogap-Continue": "off"})
            _, text = await get(gs.url + "/metrics")
    r = Seen(status, raw, 0, 0)
    assert r.error is not None and r.words == WORDS[:6] and len(a.requests) + len(b.requests) == 1
    assert metric(text, "zerogap_continuations_total", outcome="not_continued") == 1


async def test_an_error_event_inside_the_stream_is_continued_and_not_relayed(tmp_path) -> None:
    """vLLM reports an engine failure inside a 200 stream as an error event: the client does not
    see it; the answer goes on at the other backend."""
    with UpstreamServer(model="m") as a, UpstreamServer(model="m") as b:
        with GatewayServer(make_config(tmp_path, [("a", a.url, "m"), ("b", b.url, "m")], QUIET)) as gs:
            async with session() as s:
                r = await one(s, gs.url, stream_body(48, fixture={"error_after_tokens": 7}))
            _, text = await get(gs.url + "/metrics")
    assert r.finished and r.words == WORDS and r.error is None, r.raw[-300:]
    assert metric(text, "zerogap_continuations_total", reason="broken", outcome="continued") == 1
