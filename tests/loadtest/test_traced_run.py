"""api.traceparent through the real `locust -f loadtest/`: requests.csv names each request's trace id (the
one its traceparent sent upstream) and report.json lists each step's slowest requests with theirs, so a
slow request of a run is found in the trace store; without api.traceparent neither is there."""

from __future__ import annotations

import csv
from pathlib import Path

from loadreport.record import RequestRecord
from loadreport.slowest import NUM_SLOWEST, slowest_requests
from tests.fixtures.upstream import Behavior, UpstreamServer
from tests.loadtest.helpers import read_report, run_locust, write_settings

SHORT = {"steps": [4], "warmup_seconds": 0, "step_duration_seconds": 3, "measure_last_seconds": 3}


def requests_csv(run_dir: Path) -> list[dict[str, str]]:
    with (run_dir / "requests.csv").open(newline="", encoding="utf-8") as source:
        return list(csv.DictReader(source))


def test_requests_csv_and_the_slowest_requests_name_the_trace_ids_sent(tmp_path: Path) -> None:
    with UpstreamServer(Behavior(ttft_s=0.01, interval_s=0.004, num_output_tokens=6), model="test-model") as up:
        settings = write_settings(tmp_path / "settings.json", up.url, tmp_path / "runs", "traced", load_test=SHORT,
                                  api={"traceparent": True})  # fmt: skip
        result = run_locust(settings)
        sent = [s.headers.get("traceparent") or s.headers.get("Traceparent") for s in up.requests]
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = tmp_path / "runs" / "traced"
    rows, report = requests_csv(run_dir), read_report(run_dir)
    started_s = report["run"]["started_unix_s"]
    sent_ids = {value.split("-")[1] for value in sent if value is not None}
    assert len(rows) >= 8 and len(sent_ids) == len(sent)  # one trace per request
    by_id = {row["trace_id"]: row for row in rows}
    assert len(by_id) == len(rows) and set(by_id) <= sent_ids  # each row's trace id is the one it sent
    for trace_id, row in by_id.items():  # its first 16 hex digits: when it was made (µs), just before its send
        made_us, sent_us = int(trace_id[:16], 16), (started_s + float(row["sent_s"])) * 1e6
        assert made_us - 5 <= sent_us < made_us + 1e6, (made_us, sent_us)
    step = report["steps"][0]
    window_start_s, window_end_s = step["end_s"] - step["duration_s"], step["end_s"]
    ended = [r for r in rows if window_start_s <= float(r["sent_s"]) + float(r["e2e_ms"]) / 1000 < window_end_s]
    slowest = step["slowest_requests"]
    for kind, listed in (("ttft", slowest["ttft"]), ("e2e", slowest["e2e"])):
        column = f"{kind}_ms"
        truth = sorted((float(r[column]) for r in ended if r[column]), reverse=True)[:NUM_SLOWEST]
        assert [s[column] for s in listed] == truth  # the step's slowest, slowest first
        for s in listed:
            row = by_id[s["trace_id"]]
            assert (float(row["sent_s"]), float(row[column]), s["error"]) == (s["sent_s"], s[column], None)


def record(start: float, ttft_s: float | None, e2e_s: float, error: str = "", trace_id: str = "") -> RequestRecord:
    return RequestRecord(start, start + e2e_s, not error, error, ttft_s, e2e_s, 5, 10, "usage", None,
                         trace_id=trace_id)  # fmt: skip


def test_the_slowest_lists_failures_by_e2e_only_and_nothing_without_trace_ids() -> None:
    records = [record(100.0 + i, 0.1 * i, 1.0 + 0.1 * i, trace_id=f"{i:032x}") for i in range(8)]
    records.append(record(101.5, None, 30.0, "timeout", "f" * 32))
    slowest = slowest_requests(records, 100.0)
    assert slowest is not None
    assert [s["trace_id"] for s in slowest["ttft"]] == [f"{i:032x}" for i in (7, 6, 5, 4, 3)]
    assert slowest["e2e"][0] == {"sent_s": 1.5, "ttft_ms": None, "e2e_ms": 30000.0, "output_tokens": 5,
                                 "error": "timeout", "trace_id": "f" * 32}  # fmt: skip
    assert [s["e2e_ms"] for s in slowest["e2e"][1:]] == [1700.0, 1600.0, 1500.0, 1400.0]
    assert slowest_requests([record(100.0, 0.1, 1.0)], 100.0) is None  # api.traceparent off


def test_the_trace_id_travels_from_a_worker_process() -> None:
    traced = record(100.0, 0.1, 1.0, trace_id="ab" * 16)
    assert RequestRecord.from_wire(traced.to_wire()).trace_id == "ab" * 16
    assert RequestRecord.from_wire(traced.to_wire()[:17]).trace_id == ""  # an older harness's worker
