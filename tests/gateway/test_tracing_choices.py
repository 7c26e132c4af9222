"""gen_ai.response.finish_reasons of every choice, in the spans and in the request log: a stream of several
choices (n > 1, a completions list of prompts), a whole answer of one or several choices."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.relay.choice_usage import ChoiceUsage
from tests.fixtures.otlp import OtlpReceiver
from tests.fixtures.upstream import Behavior, UpstreamServer
from tests.gateway.helpers import auth, chat_body, wait_until
from tests.gateway.test_tracing import by_name, flushed, post, traced


@pytest.fixture
def otlp() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as receiver:
        yield receiver


CASES: list[tuple[str, dict[str, Any], list[str]]] = [
    ("/v1/chat/completions", chat_body(n=3, max_tokens=2), ["length"] * 3),  # streamed, capped
    ("/v1/completions", {"model": "m", "prompt": ["a b", "c d e"], "n": 2, "stream": True}, ["stop"] * 4),
    ("/v1/chat/completions", chat_body(stream=False, n=2), ["stop"] * 2),  # a whole answer (put together)
    ("/v1/completions", {"model": "m", "prompt": "a b", "max_tokens": 3}, ["length"]),  # whole, one choice
]


async def test_every_choices_finish_reason_is_in_the_spans_and_the_request_log(tmp_path: Path, otlp) -> None:
    log = tmp_path / "requests.jsonl"
    obs = f'\n[logging]\nrequest_log = "{log}"\n'
    with (
        UpstreamServer(Behavior(num_output_tokens=5), model="m") as up,
        traced(tmp_path, [("b0", up.url, "m")], otlp, obs=obs) as gs,
    ):
        for i, (path, body, _) in enumerate(CASES):
            headers = {**auth(), "traceparent": f"00-{i + 1:032x}-{'1' * 16}-01", "x-request-id": f"case-{i}"}
            status, _, _ = await post(gs.url + path, body, headers)
            assert status == 200, (path, body)
        roots = [(await flushed(gs, otlp, f"{i + 1:032x}", 5)) for i in range(len(CASES))]
        assert await wait_until(lambda: log.exists() and len(log.read_text().splitlines()) == len(CASES))
    logged = {line["request_id"]: line for line in map(json.loads, log.read_text().splitlines())}
    for i, (path, _, reasons) in enumerate(CASES):
        op = "chat" if "chat" in path else "text_completion"
        (root,) = by_name(roots[i])[f"{op} m"]
        assert root.attributes["gen_ai.response.finish_reasons"] == reasons, path
        assert logged[f"case-{i}"]["finish_reasons"] == reasons, path
        streams = by_name(roots[i]).get("stream", [])
        assert all(s.attributes["gen_ai.response.finish_reasons"] == reasons for s in streams)


def test_each_choice_is_named_by_its_index_and_one_cut_short_has_none() -> None:
    usage = ChoiceUsage(chat=False, n=2, prompt_estimates=[2, 3])
    events = [
        (0, None), (1, None), (2, None), (3, None), (1, "stop"), (0, "length"), (3, "abort"),
    ]  # fmt: skip
    for index, reason in events:
        chunk = {"choices": [{"index": index, "text": " t", "finish_reason": reason}]}
        usage.feed(f"data: {json.dumps(chunk)}\n\n".encode())
    assert usage.finish_reasons() == ["length", "stop", "", "abort"]  # choice 2: the stream was cut before it ended
    assert ChoiceUsage(chat=True, n=2, prompt_estimates=[2]).finish_reasons() == []
