"""api.max_retries: a request that failed before its first byte of content (connection
error, HTTP 429, HTTP 5xx) is sent again, up to max_retries times. The record keeps the
first attempt's start, so TTFT and E2E count the time lost to the failed attempts, and
it counts its retries (the report sums them per step)."""

from __future__ import annotations

from collections.abc import Callable

import gevent

from loadgen.failfast import key_refused
from loadreport.record import RequestRecord

FIRST_PAUSE_S = 0.05
MAX_PAUSE_S = 1.0
Attempt = Callable[[], tuple[RequestRecord, list[float], str]]


def retryable(record: RequestRecord, walls: list[float], detail: str = "") -> bool:
    """Failed before any content arrived, in a way a later attempt may not (not a key the gateway
    refused: its 429 for too many failed authentications is not retried, the key is wrong)."""
    if record.ok or walls or key_refused(record.error_kind, detail):
        return False
    kind = record.error_kind
    return kind == "connection error" or kind == "HTTP 429" or kind.startswith("HTTP 5")


def pause_s(attempt: int) -> float:
    return float(min(MAX_PAUSE_S, FIRST_PAUSE_S * 2**attempt))


def with_retries(attempt: Attempt, max_retries: int) -> tuple[RequestRecord, list[float], str]:
    record, walls, detail = attempt()
    first_start = record.start
    num_retries = 0
    while num_retries < max_retries and retryable(record, walls, detail):
        gevent.sleep(pause_s(num_retries))
        num_retries += 1
        record, walls, detail = attempt()
    if num_retries:
        lost_s = record.start - first_start
        record.start = first_start
        record.e2e_s += lost_s
        if record.ttft_s is not None:
            record.ttft_s += lost_s
        if record.ttfa_s is not None:
            record.ttfa_s += lost_s
        record.retries = num_retries
    return record, walls, detail
