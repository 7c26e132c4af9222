"""The harness's bookkeeping: requests cut off before their usage arrived."""

from __future__ import annotations

from loadtest._client import INTERRUPTED
from loadtest._harness import Harness
from loadtest._record import RequestRecord


def record(ok: bool, tokens: int, source: str) -> RequestRecord:
    return RequestRecord(100.0, 101.0, ok, "" if ok else INTERRUPTED, 0.1, 1.0, tokens, 5, source, None)


def test_cut_off_requests_count_chunks_at_the_servers_tokens_per_chunk() -> None:
    harness = Harness()
    harness.keep(record(True, 8, "usage"), [100.2, 100.4, 100.6, 100.8])  # 2 tokens per chunk
    cut = record(False, 3, "chunks")
    harness.keep(cut, [100.2, 100.4, 100.6])
    assert (cut.output_tokens, cut.token_source) == (6, "estimated")
    assert harness.recorder.tokens_between(100.0, 101.0) == 14.0


def test_without_any_usage_seen_chunks_stay_chunks() -> None:
    harness = Harness()
    cut = record(False, 3, "chunks")
    harness.keep(cut, [100.2, 100.4, 100.6])
    assert (cut.output_tokens, cut.token_source) == (3, "chunks")
