"""bench/continuation.py's own pieces (no processes): how one stream is judged, the gateway's
config, the verdict and its exit status."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from bench import continuation as bench
from bench.continuation import ModeResult, judge_stream, verdict
from common.config import load_config


def event(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def chunk(text: str | None, cid: str = "chatcmpl-1", role: bool = False, finish: str | None = None) -> bytes:
    delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else {"content": text}
    return event({"id": cid, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})


def stream(n: int = 4, words: list[int] | None = None, usage: int | None = None, tail: bytes = b"") -> bytes:
    words = list(range(n)) if words is None else words
    parts = [chunk(None, role=True)]
    parts += [chunk(f" t{k}", finish="length" if i == len(words) - 1 else None) for i, k in enumerate(words)]
    num_usage = n if usage is None else usage
    parts.append(event({"id": "chatcmpl-1", "choices": [], "usage": {"completion_tokens": num_usage}}))
    return b"".join(parts) + tail + b"data: [DONE]\n\n"


ERROR = event({"error": {"message": "Backend up0 broke the stream", "code": 502}})


def test_a_whole_stream_and_each_way_to_be_cut() -> None:
    assert judge_stream(stream(4), 4) == "whole"
    assert judge_stream(b": keep-alive\n\n" + stream(4), 4) == "whole"  # comments are no words
    assert judge_stream(stream(4, [0, 1]), 4) == "missing"
    assert judge_stream(stream(4, [0, 1, 1, 2, 3]), 4) == "wrong_words"  # a word twice
    assert judge_stream(stream(4, [0, 2, 1, 3]), 4) == "wrong_words"
    assert judge_stream(stream(4, [0, 1], tail=ERROR), 4) == "error_event"  # as the gateway ends a broken one
    assert judge_stream(stream(4, tail=ERROR), 4) == "error_event"  # an error even with every word
    assert judge_stream(stream(4)[: -len(b"data: [DONE]\n\n")], 4) == "no_done"
    assert judge_stream(stream(4) + b"data: [DONE]\n\n", 4) == "done_twice"
    assert judge_stream(stream(4), 4, lost=True) == "lost"
    assert judge_stream(stream(4, usage=2), 4) == "usage"  # charged the continuation's tokens only


def test_a_seam_the_client_can_see_is_not_whole() -> None:
    second_role = stream(4).replace(b"data: {", chunk(None, role=True) + b"data: {", 2)  # a role chunk inserted
    assert judge_stream(second_role, 4) == "seam"
    second_id = stream(4).replace(b'"chatcmpl-1", "choices": [{"index": 0, "delta": {"content": " t3"}',
                                  b'"chatcmpl-2", "choices": [{"index": 0, "delta": {"content": " t3"}')  # fmt: skip
    assert second_id != stream(4)
    assert judge_stream(second_id, 4) == "seam"


def result(continued: bool, cut: int, continuations: float = 0.0, requests: int = 100) -> ModeResult:
    r = ModeResult(continued, num_requests=requests, num_whole=requests - cut, num_cut=cut)
    r.cut_reasons = Counter({"error_event": cut} if cut else {})
    r.continuations = {"continued": continuations, "failed": 0.0, "not_continued": 0.0 if continued else cut}
    return r


def test_the_verdict() -> None:
    ok, line = verdict([result(False, 60, 0, 777), result(True, 0, 61, 813)])
    assert ok and line.startswith("verdict: PASS"), line
    assert "off: 60 of 777 streams cut" in line and "on: 0 of 813 cut, 61 continued" in line
    ok, line = verdict([result(False, 60), result(True, 2, 59)])
    assert not ok and "continue_streams=true left 2 streams cut" in line
    ok, line = verdict([result(False, 0), result(True, 0, 61)])  # the kill broke nothing with it off
    assert not ok and "nothing measured" in line
    ok, line = verdict([result(True, 0, 0)])  # nor with it on
    assert not ok and "counted no continuation" in line
    assert verdict([result(True, 0, 5)])[0]  # one mode alone is judged by its own rule
    assert not verdict([])[0]
    refusing = result(False, 60)
    refusing.num_refused = 3
    ok, line = verdict([refusing, result(True, 0, 61)])  # the other backend was there to serve them
    assert not ok and "refused or failed 3 requests" in line


def test_the_log_excerpt_names_warnings_and_the_first_traceback() -> None:
    log = "\n".join(
        [
            "04:05:00 INFO gateway: listening",
            "04:05:01 WARNING gateway.relay.relay: backend up0 broke the stream: reset",
            "04:05:01 ERROR gateway.server.middleware: unexpected error on POST /v1/chat/completions",
            "Traceback (most recent call last):",
            '  File "gateway/relay/relay.py", line 1, in run',
            "    boom()",
            "KeyError: 'x'",
            "04:05:02 INFO gateway: still here",
            "Traceback (most recent call last):",
            "ValueError: a second one, not shown",
        ]
    )
    shown = bench.log_excerpt(log)
    assert shown[:2] == [log.splitlines()[1], log.splitlines()[2]]
    assert shown[2:] == log.splitlines()[3:7]  # the first traceback, through its exception's line


def test_counting_outcomes() -> None:
    r = ModeResult(True)
    for outcome in ("whole", "whole", "refused", "failed", "missing", "error_event"):
        r.count(outcome, "seen")
    assert (r.num_requests, r.num_whole, r.num_refused, r.num_failed, r.num_cut) == (6, 2, 1, 1, 2)
    assert r.cut_reasons == Counter({"missing": 1, "error_event": 1})
    assert len(r.examples) == 3  # at most three kept


@pytest.mark.parametrize("continued", [False, True])
def test_the_gateway_config_loads_with_both_backends(tmp_path: Path, continued: bool) -> None:
    path = bench.write_config(tmp_path, 18000, [18001, 18002], continued)
    config = load_config(path)
    assert config.gateway.continue_streams is continued
    assert config.gateway.health_interval_s == 0.2 and config.gateway.eject_grace_s == 0.5
    assert config.gateway.connect_timeout_s == 5.0  # the default: a dropped SYN comes again after 1 s
    assert [(b.name, b.url, b.model) for b in config.backends] == [
        ("up0", "http://127.0.0.1:18001", "m"),
        ("up1", "http://127.0.0.1:18002", "m"),
    ]


def test_modes_and_exit_status(monkeypatch: pytest.MonkeyPatch) -> None:
    assert bench.parse_modes("off,on") == (False, True) and bench.parse_modes("on") == (True,)
    seen: list[bool] = []

    def fake_mode(opts: bench.Options, continued: bool) -> ModeResult:
        seen.append(continued)
        return result(continued, 0 if continued else 5, 5 if continued else 0)

    monkeypatch.setattr(bench, "run_mode", fake_mode)
    assert bench.main(["--rounds", "2"]) == 0
    assert seen == [False, True, True, False]  # the order alternates
    monkeypatch.setattr(bench, "run_mode", lambda opts, continued: result(continued, 3, 5))
    assert bench.main(["--modes", "on"]) == 1
