"""One run's state, from Locust's test_start to its test_stop: created whole when the run starts
(so nothing in it is "not set yet"), and finished into the run folder on the master."""

from __future__ import annotations

import itertools
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gevent

from loadgen.arrivals import Arrivals
from loadgen.dataset_source import DatasetBodies
from loadgen.replay import TraceReplay
from loadgen.sampler import Sampler
from loadgen.stopper import Stopper
from loadgen.workload import Workload
from loadreport.console import progress_line, table
from loadreport.record import BUCKETS_PER_S, INTERRUPTED, Recorder, RequestRecord, TokensPerChunk
from loadreport.report import write_run
from loadreport.run_summary import summarize_run
from loadreport.schedule import LoadSchedule
from loadreport.schema import Step
from loadreport.settings import Settings


@dataclass
class Prompt:
    """What the users send: the calibrated prompt, or per-user sessions of a shaped workload."""

    text: str = ""
    source: str = "approx"  # how its length was counted: "tokenize", "approx", or a worker's
    workload: Workload | None = None


@dataclass
class Run:
    settings: Settings
    plan: LoadSchedule
    base_url: str
    stopper: Stopper
    start_s: float = field(default_factory=time.time)  # wall clock (the timeline's and the workers')
    recorder: Recorder = field(default_factory=Recorder)
    chunk_ratio: TokensPerChunk = field(default_factory=TokensPerChunk)
    model: str = ""
    prompt: Prompt = field(default_factory=Prompt)
    arrivals: Arrivals | None = None  # open loop only
    replay: TraceReplay | None = None  # load_test.trace: the trace's sends in place of the arrivals
    trace_rows: int = 0  # load_test.trace: its rows (0: no trace); the run ends when each has its record
    bodies: DatasetBodies | None = None  # workload.dataset: what the users send
    source: dict[str, Any] | None = None  # report.json's run.source (a dataset or a trace)
    planned_lengths: dict[int, tuple[int, int]] | None = None  # a trace's lengths by line, for requests.csv
    sampler: Sampler | None = None  # the master's (or a local run's) timeline of server signals
    run_dir: Path | None = None  # where the master writes the run
    greenlets: list[gevent.Greenlet] = field(default_factory=list)
    num_workers: int = 1  # worker processes that took part (1: a local run)
    in_flight: dict[int, float] = field(default_factory=dict)  # this process's requests streaming: id -> sent at
    final_steps: dict[int, Step] = field(default_factory=dict)  # step index -> its line's summary
    ended_s: float | None = None  # when the plan's last step ended (wall clock); None: not yet, or stopped
    drain_s: float = 0.0  # how long the users may then finish their streams (loadgen/ending.py)
    _request_ids: itertools.count[int] = field(default_factory=itertools.count)

    def keep(self, record: RequestRecord, walls: list[float]) -> None:
        self.chunk_ratio.apply(record, walls)
        self.recorder.add(record, walls)

    def request_sent(self) -> int:
        """A request of this process starts (wall clock now); `request_kept` when its record is kept."""
        request_id = next(self._request_ids)
        self.in_flight[request_id] = time.time()
        return request_id

    def request_kept(self, request_id: int) -> None:
        self.in_flight.pop(request_id, None)

    def oldest_in_flight(self) -> float | None:
        """When this process's oldest request still streaming was sent (None: none is)."""
        return min(self.in_flight.values(), default=None)

    def trace_done(self) -> bool:
        """A trace's every row has been answered (its record kept here: a worker's come with its reports)."""
        return self.trace_rows > 0 and len(self.recorder.records) >= self.trace_rows

    def trace_end_s(self) -> float | None:
        """When a finished trace's last request ended, to the end of its 100 ms token bucket (so that its
        last tokens count whole); None while a row is unanswered."""
        if not self.trace_done():
            return None
        last = max(record.end for record in self.recorder.records)
        return (math.floor(last * BUCKETS_PER_S) + 1) / BUCKETS_PER_S

    def stop_greenlets(self) -> None:
        for greenlet in self.greenlets:
            greenlet.kill(block=False)
        self.greenlets = []

    def finish(self, end_s: float) -> str | None:
        """Write the run folder and print the steps' last lines and the table; returns the line that says
        where the report is (the harness prints it last). A run stopped for a reason the user must fix
        prints that reason instead (no empty table) and returns None."""
        assert self.sampler is not None and self.run_dir is not None, "finish() runs where the run was sampled"
        if self.stopper.reason:
            sys.stderr.write(f"zerogap loadtest: {self.stopper.reason}\n")
            sys.stderr.flush()
        samples = self.sampler.samples
        summary = summarize_run(
            self.settings, self.plan, self.start_s, end_s, self.recorder, samples, final=self.final_steps
        )
        meta: dict[str, Any] = {
            "base_url": self.base_url,
            "model": self.model,
            "stopped_early": self.stopper.reason or None,
            "endpoint": self.settings.api.path(),
            "mode": "open_loop" if self.plan.open_loop else "closed_loop",
            "prompt_tokens_from": self.prompt.source,
            "num_worker_processes": self.num_workers,
            "interrupted_requests": sum(1 for r in self.recorder.records if r.error_kind == INTERRUPTED),
        }
        if self.source is not None:
            meta["source"] = self.source
        report_html = write_run(
            self.run_dir, self.settings, self.plan, self.start_s, end_s, summary, meta, self.recorder, samples,
            self.planned_lengths,
        )  # fmt: skip
        if self.stopper.reason:
            sys.stderr.write(f"zerogap loadtest: the run stopped early; its folder: {self.run_dir}\n")
            return None
        for step in summary.steps:  # the steps whose line has not been printed yet (the last one, at least)
            if step.index not in self.final_steps:
                print(progress_line(step, len(self.plan.steps)), flush=True)
        print(table(summary.to_json()), flush=True)
        return f"zerogap report: {report_html}"
