"""Requests cut off before their usage arrived (the harness applies this to each record).

(Nothing here imports locust: importing it monkey-patches the test process.)"""

from __future__ import annotations

from loadreport.record import INTERRUPTED, Recorder, RequestRecord, TokensPerChunk


def record(ok: bool, tokens: int, source: str, prompt_tokens: int = 5) -> RequestRecord:
    return RequestRecord(100.0, 101.0, ok, "" if ok else INTERRUPTED, 0.1, 1.0, tokens, prompt_tokens, source, None)


def test_cut_off_requests_count_chunks_at_the_servers_tokens_per_chunk() -> None:
    ratio, recorder = TokensPerChunk(), Recorder()
    for rec, walls in ((record(True, 8, "usage"), [100.2, 100.4, 100.6, 100.8]), (record(False, 3, "chunks", 0),
                       [100.2, 100.4, 100.6])):  # fmt: skip
        ratio.apply(rec, walls)
        recorder.add(rec, walls)
    cut = recorder.records[1]
    assert (cut.output_tokens, cut.token_source) == (6, "estimated")  # 2 tokens per chunk
    assert recorder.tokens_between(100.0, 101.0) == 14.0
    assert cut.prompt_tokens == 5  # no usage came: the prompt counts at the mean prompt seen
    assert recorder.tokens_between(100.0, 101.0, prompt=True) == 10.0


def test_without_any_usage_seen_chunks_stay_chunks() -> None:
    cut = record(False, 3, "chunks")
    TokensPerChunk().apply(cut, [100.2, 100.4, 100.6])
    assert (cut.output_tokens, cut.token_source) == (3, "chunks")
