"""requests.csv: one row per request of the run, in the order they were sent, each request's planned
and actual send side by side (open loop: Poisson arrivals or a trace), and what came back.

Columns: `sent_s` (from the run's start), `planned_s` (open loop; empty in closed loop), `send_lag_ms`
(actual - planned), `line` (the dataset's or trace's file line it came from; empty for made-up
prompts), `trace_input_tokens` / `trace_output_tokens` (a trace's lengths for that line), `ok`,
`error`, `ttft_ms`, `ttfa_ms` (the first answer token), `e2e_ms`, `prompt_tokens`, `cached_tokens`,
`output_tokens`, `reasoning_tokens`, `retries`, `trace_id` (api.traceparent: the W3C trace id the request
sent, to look it up in the trace store; empty when not traced).
"""

from __future__ import annotations

import csv
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from loadreport.record import RequestRecord

COLUMNS = (
    "sent_s",
    "planned_s",
    "send_lag_ms",
    "line",
    "trace_input_tokens",
    "trace_output_tokens",
    "ok",
    "error",
    "ttft_ms",
    "ttfa_ms",
    "e2e_ms",
    "prompt_tokens",
    "cached_tokens",
    "output_tokens",
    "reasoning_tokens",
    "retries",
    "trace_id",
)


def _ms(seconds: float | None) -> str:
    return "" if seconds is None else f"{seconds * 1000:.3f}"


def row(record: RequestRecord, run_start: float, planned: Mapping[int, tuple[int, int]]) -> dict[str, Any]:
    lengths = planned.get(record.line)
    lag = record.send_lag_s
    return {
        "sent_s": f"{record.start - run_start:.6f}",
        "planned_s": "" if lag is None else f"{record.start - lag - run_start:.6f}",
        "send_lag_ms": _ms(lag),
        "line": record.line or "",
        "trace_input_tokens": "" if lengths is None else lengths[0],
        "trace_output_tokens": "" if lengths is None else lengths[1],
        "ok": int(record.ok),
        "error": record.error_kind,
        "ttft_ms": _ms(record.ttft_s),
        "ttfa_ms": _ms(record.ttfa_s),
        "e2e_ms": _ms(record.e2e_s),
        "prompt_tokens": record.prompt_tokens,
        "cached_tokens": "" if record.cached_tokens is None else record.cached_tokens,
        "output_tokens": record.output_tokens,
        "reasoning_tokens": "" if record.reasoning_tokens is None else record.reasoning_tokens,
        "retries": record.retries,
        "trace_id": record.trace_id,
    }


def write_requests(
    path: Path, records: list[RequestRecord], run_start: float, planned: Mapping[int, tuple[int, int]] | None = None
) -> None:
    """planned: a trace's (input, output) tokens by file line."""
    with path.open("w", newline="", encoding="utf-8") as out:
        writer = csv.DictWriter(out, fieldnames=COLUMNS)
        writer.writeheader()
        for record in sorted(records, key=lambda r: r.start):
            writer.writerow(row(record, run_start, planned or {}))


def read_requests(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as source:
        return list(csv.DictReader(source))
