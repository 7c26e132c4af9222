"""api.traceparent: with it, each request the harness's client sends carries a sampled W3C
traceparent of its own whose trace id starts with the request's send time (requests.csv's
`start`, in microseconds), so a slow request of a run can be found in the trace store; without
it, none."""

from __future__ import annotations

import json

from loadgen.client import StreamClient
from loadreport.settings import ApiSection
from tests.fixtures.upstream import Behavior, UpstreamServer

BODY = json.dumps({"model": "test-model", "messages": [{"role": "user", "content": "a b"}], "max_tokens": 2,
                   "stream": True}).encode()  # fmt: skip


def sent_traceparents(traced: bool) -> tuple[list[str | None], list[float]]:
    with UpstreamServer(Behavior(num_output_tokens=2)) as up:
        streamer = StreamClient(up.url, "/v1/chat/completions", {}, 5.0, 10.0, traced=traced)
        starts = [streamer.stream(BODY)[0].start for _ in range(3)]
        streamer.close()
        sent = [next((v for k, v in s.headers.items() if k.lower() == "traceparent"), None) for s in up.requests]
        return sent, starts


def test_each_request_sends_its_own_sampled_traceparent_named_after_its_send_time() -> None:
    sent, starts = sent_traceparents(True)
    assert all(t is not None for t in sent) and len(set(sent)) == 3
    for value, start in zip(sent, starts, strict=True):
        assert value is not None
        version, trace_id, span_id, flags = value.split("-")
        assert (version, flags, len(trace_id), len(span_id)) == ("00", "01", 32, 16)
        made_us = int(trace_id[:16], 16)  # when the request was made: its send (start) follows at once
        assert made_us <= start * 1e6 < made_us + 1e6, (made_us, start)


def test_no_traceparent_unless_asked() -> None:
    assert ApiSection().traceparent is False
    assert ApiSection.model_validate({"traceparent": True}).traceparent is True
    assert sent_traceparents(False)[0] == [None, None, None]
