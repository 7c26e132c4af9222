"""A step's slowest requests with their trace ids (api.traceparent): report.json's `slowest_requests`,
so that a slow request of a run is found in the trace store (Jaeger: search by its trace id) and in
requests.csv (its `sent_s`)."""

from __future__ import annotations

from typing import Any

from loadreport.record import RequestRecord

NUM_SLOWEST = 5  # per list


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)


def slow_request(record: RequestRecord, run_start: float) -> dict[str, Any]:
    return {
        "sent_s": round(record.start - run_start, 6),
        "ttft_ms": _ms(record.ttft_s),
        "e2e_ms": round(record.e2e_s * 1000, 3),
        "output_tokens": record.output_tokens,
        "error": None if record.ok else record.error_kind,
        "trace_id": record.trace_id,
    }


def slowest_requests(ended: list[RequestRecord], run_start: float) -> dict[str, Any] | None:
    """The successful requests with the longest TTFT and the requests (failed ones too) with the longest
    E2E, slowest first; None when no request that ended carries a trace id (api.traceparent off)."""
    traced = [r for r in ended if r.trace_id]
    if not traced:
        return None
    by_ttft = sorted((r for r in traced if r.ok and r.ttft_s is not None), key=lambda r: r.ttft_s or 0.0, reverse=True)
    by_e2e = sorted(traced, key=lambda r: r.e2e_s, reverse=True)
    return {
        "ttft": [slow_request(r, run_start) for r in by_ttft[:NUM_SLOWEST]],
        "e2e": [slow_request(r, run_start) for r in by_e2e[:NUM_SLOWEST]],
    }
