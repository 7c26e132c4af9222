"""gateway/relay/sse.py: SSE events split across reads; the backend's usage read on every chunk (without
decoding the chunks) and shown to the client only as far as it asked; tokens counted when the
backend reports none."""

from __future__ import annotations

import json

import pytest

from backends.sim.server.protocol import GenerationRequest
from backends.sim.server.sse import ResponseBuilder
from gateway.relay.sse import SHOW_ALL, SHOW_FINAL, SHOW_NONE, SseFilter, shown_usage

CHUNK = b'data: {"id":"x","choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'
ROLE = b'data: {"id":"x","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
USAGE = b'data: {"id":"x","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":7,"total_tokens":10}}\n\n'
DONE = b"data: [DONE]\n\n"


def with_usage(num_completion: int, details: bytes = b"null") -> bytes:
    """A content chunk with continuous usage, as vLLM sends it (usage after choices)."""
    usage = b'{"prompt_tokens":3,"total_tokens":%d,"completion_tokens":%d,"prompt_tokens_details":%s}' % (
        3 + num_completion,
        num_completion,
        details,
    )
    return b'data: {"id":"x","choices":[{"index":0,"delta":{"content":"hi"}}],"usage":' + usage + b"}\n\n"


def run(f: SseFilter, stream: bytes, step: int) -> bytes:
    out = b"".join(f.feed(stream[i : i + step]) for i in range(0, len(stream), step))
    return out + f.rest()


@pytest.mark.parametrize("step", [1, 7, 10_000])
def test_events_split_across_reads_are_forwarded_whole_and_usage_read(step: int) -> None:
    f = SseFilter(SHOW_NONE)
    assert run(f, CHUNK * 2 + USAGE + DONE, step) == CHUNK * 2 + DONE
    assert f.reported() == (3, 7)


def test_continuous_usage_is_read_on_every_chunk_and_shown_only_as_asked() -> None:
    stream = with_usage(1) + with_usage(2, b'{"cached_tokens":2}') + USAGE + DONE
    shown = {}
    for show in (SHOW_NONE, SHOW_FINAL, SHOW_ALL):
        f = SseFilter(show)
        shown[show] = run(f, stream, 9)
        assert f.reported() == (3, 7)
    assert shown[SHOW_NONE] == CHUNK * 2 + DONE  # no usage field anywhere, no usage-only chunk
    assert shown[SHOW_FINAL] == CHUNK * 2 + USAGE + DONE  # exactly the final usage chunk
    assert shown[SHOW_ALL] == stream  # as the backend sent it
    for show in (SHOW_NONE, SHOW_FINAL):  # what is left is still valid JSON, event by event
        payloads = [e[6:] for e in shown[show].split(b"\n\n") if e and e != b"data: [DONE]"]
        assert all(isinstance(json.loads(p), dict) for p in payloads)


@pytest.mark.parametrize("show", [SHOW_NONE, SHOW_FINAL, SHOW_ALL])
def test_one_event_per_read_as_vllm_sends_keeps_every_other_byte(show: int) -> None:
    """Each read one event (the usual path: usage flat and last, cut by slicing), among reads
    whose usage holds an object (*_details) or that end the stream: the same bytes either way."""
    events = [with_usage(1), with_usage(2, b'{"cached_tokens":2}'), with_usage(3), with_usage(6), USAGE, DONE]
    f = SseFilter(show)
    out = [f.feed(e) for e in events]
    expected = {
        SHOW_NONE: [CHUNK] * 4 + [b"", DONE],
        SHOW_FINAL: [CHUNK] * 4 + [USAGE, DONE],
        SHOW_ALL: events,
    }[show]
    assert out == expected
    assert f.reported() == (3, 7)
    f.feed(with_usage(9)[:-2])  # an event not yet complete: nothing relayed, its usage not read
    assert f.reported() == (3, 7)


def test_a_stream_cut_short_reports_the_last_usage_relayed() -> None:
    f = SseFilter(SHOW_NONE)
    f.feed(with_usage(1) + with_usage(2))
    f.feed(with_usage(3) + with_usage(4)[:20])  # the 4th chunk never completed: not relayed, not counted
    assert f.reported() == (3, 3)


@pytest.mark.parametrize("spaced", [False, True])
def test_two_usage_events_in_one_read_with_usage_shown_charge_the_last(spaced: bool) -> None:
    """A client that asked for continuous usage sees every usage field; when one read holds two
    events, the usage kept is the second one's (usage is cumulative), null being no usage; compact
    JSON or not (with spaces: the regular-expression path)."""

    def read(data: bytes) -> bytes:
        return data.replace(b',"usage":', b', "usage": ') if spaced else data

    f = SseFilter(SHOW_ALL)
    assert f.feed(read(with_usage(1) + with_usage(2))) == read(with_usage(1) + with_usage(2))
    assert f.reported() == (3, 2)
    f.feed(read(with_usage(3) + with_usage(5) + with_usage(4)[:30]))  # the third event is not complete yet
    assert f.reported() == (3, 5)
    null = CHUNK[:-3] + b',"usage":null}\n\n'  # OpenAI's "no usage in this chunk"
    f.feed(read(with_usage(4)[30:] + null))
    assert f.reported() == (3, 4)  # the last object stands


def test_openai_style_null_usage_is_not_taken_for_usage() -> None:
    f = SseFilter(SHOW_FINAL)
    with_null = b'data: {"choices":[{"delta":{}}],"usage":null}\n\n'
    assert f.feed(with_null) == b'data: {"choices":[{"delta":{}}]}\n\n'
    assert f.reported() == (None, None) and f.num_chunks == 1  # counted, as long as no usage came
    assert f.feed(with_null + USAGE + DONE) == b'data: {"choices":[{"delta":{}}]}\n\n' + USAGE + DONE
    assert f.reported() == (3, 7)


def test_usage_inside_the_generated_text_is_neither_read_nor_cut() -> None:
    text = b'data: {"choices":[{"index":0,"delta":{"content":"x,\\"usage\\":{\\"prompt_tokens\\":9}"}}]}\n\n'
    f = SseFilter(SHOW_NONE)
    assert f.feed(text) == text
    assert f.reported() == (None, None) and f.num_chunks == 1


def test_without_usage_the_content_chunks_are_counted() -> None:
    f = SseFilter(SHOW_NONE)
    completion = b'data: {"id":"c","choices":[{"index":0,"text":" a","finish_reason":null}]}\n\n'
    assert f.feed(ROLE + CHUNK) == ROLE + CHUNK  # the opener and the first token in one read
    assert run(f, CHUNK * 4, 5) == CHUNK * 4
    run(f, completion * 3 + DONE, 11)
    assert f.reported() == (None, None) and f.num_chunks == 8  # the role-only opener is no token


def test_crlf_events_are_not_held_back() -> None:
    f = SseFilter(SHOW_NONE)
    assert f.feed(b"data: 1\r\n\r\ndata: 2") == b"data: 1\r\n\r\n"
    assert f.rest() == b"data: 2"


@pytest.mark.parametrize("chat", [True, False])
def test_the_sims_own_chunks(chat: bool) -> None:
    """The bytes of backends/sim (vLLM's shapes) with continuous usage: read exactly, stripped cleanly."""
    request = GenerationRequest(chat, [1, 2, 3, 4], 8, True, True, True, False, frozenset())
    builder = ResponseBuilder(request, "m")
    stream = builder.first_chunk() + builder.token_chunks([5, 6, 7], 0, None) + builder.token_chunks([8], 3, "length")
    stream += builder.end_chunks("length", 4, 0, sent_final=True)
    for show in (SHOW_NONE, SHOW_FINAL, SHOW_ALL):
        f = SseFilter(show)
        out = run(f, stream, 13)
        assert f.reported() == (4, 4)
        objects = [json.loads(e[6:]) for e in out.split(b"\n\n") if e and e != b"data: [DONE]"]
        with_usage_field = [o for o in objects if "usage" in o]
        expected = {SHOW_NONE: 0, SHOW_FINAL: 1, SHOW_ALL: len(objects)}[show]
        assert len(with_usage_field) == expected
        assert len([o for o in objects if o["choices"]]) == 4 + chat  # every content chunk is still there


def test_shown_usage_follows_the_clients_stream_options() -> None:
    assert shown_usage(False, False) == shown_usage(False, True) == SHOW_NONE  # as vLLM: continuous needs include
    assert shown_usage(True, False) == SHOW_FINAL and shown_usage(True, True) == SHOW_ALL
