"""The run's one timeline, timeline.csv: the server-side samples taken live every
sample_interval_ms (users, GPU utilization, backend queues; loadgen/sampler.py takes them),
joined at the end with the client-side figures of the same intervals (TPS, TTFT, TPOT) from
the records, and read back for report.html."""

from __future__ import annotations

import bisect
import csv
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from loadreport.histogram import Histogram
from loadreport.record import Recorder
from loadreport.schedule import LoadSchedule


@dataclass
class Sample:
    wall: float
    users: int
    gpu_util: float | None
    gpu_util_reason: str
    running: float | None
    waiting: float | None
    kv_cache_usage: float | None
    token_interval_ms: float | None  # the GPU's idle gap between two forwards
    cpu_interval_ms: float | None = None  # the CPU work per step, hidden or not
    preemptions_total: float | None = None
    max_num_seqs: int | None = None  # the engines' summed cap, where they say it
    prefix_cache_hits: float | None = None  # counters summed over the backends (tokens)
    prefix_cache_queries: float | None = None
    gateway_inflight: float | None = None  # what zerogap's gateway had passed on to the engines


COLUMNS = [
    "time_s",
    "phase",
    "users",
    "output_tps",
    "total_tps",
    "rps",
    "ttft_p50_ms",
    "tpot_p50_ms",
    "gpu_util",
    "gpu_util_reason",
    "backend_running",
    "backend_waiting",
    "kv_cache_usage",
    "token_interval_ms",
    "cpu_interval_ms",
    "preemptions_total",
    "loadgen_cpu_percent",
    "gateway_inflight",
]


def _phase_name(plan: LoadSchedule, run_time_s: float) -> str:
    phase = plan.phase_at(run_time_s)
    if phase is None:
        return "end"
    return "warmup" if phase.index < 0 else f"step{phase.index}"


def build_rows(samples: list[Sample], recorder: Recorder, plan: LoadSchedule, run_start: float) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    records = sorted((r for r in recorder.records if r.ok), key=lambda r: r.end)
    ends = [r.end for r in records]
    previous = run_start
    for sample in samples:
        span = sample.wall - previous
        if span <= 0:
            continue
        done = records[bisect.bisect_left(ends, previous) : bisect.bisect_left(ends, sample.wall)]
        ttft, tpot = Histogram(), Histogram()
        for record in done:
            if record.ttft_s is not None:
                ttft.add_ms(record.ttft_s * 1000)
            if record.tpot_s is not None:
                tpot.add_ms(record.tpot_s * 1000)
        output = recorder.tokens_between(previous, sample.wall)
        prompt = recorder.tokens_between(previous, sample.wall, prompt=True)
        cpu = recorder.busiest_cpu_between(previous, sample.wall)
        values = asdict(sample)
        rows.append(
            {
                "time_s": round(sample.wall - run_start, 3),
                "phase": _phase_name(plan, sample.wall - run_start - 1e-6),
                "users": sample.users,
                "output_tps": round(output / span, 2),
                "total_tps": round((output + prompt) / span, 2),
                "rps": round(len(done) / span, 3),
                "ttft_p50_ms": ttft.percentile(50),
                "tpot_p50_ms": tpot.percentile(50),
                "gpu_util": values["gpu_util"],
                "gpu_util_reason": values["gpu_util_reason"],
                "backend_running": values["running"],
                "backend_waiting": values["waiting"],
                "kv_cache_usage": values["kv_cache_usage"],
                "token_interval_ms": values["token_interval_ms"],
                "cpu_interval_ms": values["cpu_interval_ms"],
                "preemptions_total": values["preemptions_total"],
                "loadgen_cpu_percent": None if cpu is None else round(cpu, 1),
                "gateway_inflight": values["gateway_inflight"],
            }
        )
        previous = sample.wall
    return rows


def write_csv(rows: list[dict[str, Any]], path: Path) -> None:
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS)
        writer.writeheader()
        for row in rows:
            writer.writerow({key: "" if row.get(key) is None else row[key] for key in COLUMNS})


def read_csv(path: Path) -> list[dict[str, Any]]:
    """timeline.csv back into rows: numbers as floats, empty cells as None."""
    rows: list[dict[str, Any]] = []
    with path.open(newline="", encoding="utf-8") as handle:
        for raw in csv.DictReader(handle):
            row: dict[str, Any] = {}
            for key, text in raw.items():
                if key in ("phase", "gpu_util_reason"):
                    row[key] = text
                else:
                    row[key] = float(text) if text not in ("", None) else None
            rows.append(row)
    return rows
