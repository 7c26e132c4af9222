"""What a run prints while it runs: a progress line as it starts and every --progress-seconds
(the phase, the warm-up included, its users, time done and left, output tok/s, GPU busy,
failures), and each step's final line as soon as its figures are final.

A step's figures are final once every request that could stream a token into its window
has ended and been kept: in a local run, no request sent before the window's end is still
streaming (Run.in_flight); on a master, whose workers report every 3 s, the window's end
lies a report and the longest request seen so far behind. The step's summary is then kept
in Run.final_steps and report.json takes it as it is, so the step's line and the final
table print the same figures. A token counts when its request ends (usage comes last), so
the live output tok/s is taken over the latest seconds whose requests have all ended.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import gevent

from loadgen.run import Run
from loadreport.console import LiveFigures, live_line, progress_line
from loadreport.record import INTERRUPTED
from loadreport.schedule import Phase
from loadreport.summary import summarize_step

PROGRESS_S = 5.0  # --progress-seconds' default
TICK_S = 0.5  # how often a finished step is checked for its final line
RECENT_S = 10.0  # the live output tok/s and GPU busy are over this many seconds
WORKER_REPORT_DELAY_S = 4.0  # workers report every 3 s: a step's last records reach the master this late
MAX_LAG_S = 30.0  # the live figure's seconds end at most this long ago, however long a request streams
MIN_SPAN_S = 1.0  # the live output tok/s needs this many seconds of the phase whose requests all ended
FINAL_WAIT_MAX_S = 60.0  # a step's final line waits at most this long after the step for requests still streaming


@dataclass
class Tally:
    """Requests that ended, per phase (index -> count), and the longest one seen, read from the
    recorder's records once each."""

    num_counted: int = 0
    ok: Counter[int] = field(default_factory=Counter)
    failed: Counter[int] = field(default_factory=Counter)
    longest_s: float = 0.0

    def update(self, run: Run) -> None:
        records = run.recorder.records
        for record in records[self.num_counted :]:
            self.longest_s = max(self.longest_s, record.end - record.start)
            phase = run.plan.phase_at(record.end - run.start_s)
            if phase is None or record.error_kind == INTERRUPTED:
                continue
            (self.ok if record.ok else self.failed)[phase.index] += 1
        self.num_counted = len(records)


def settled_until(run: Run, tally: Tally, now: float, is_master: bool) -> float:
    """Every token that arrived before this wall-clock time has been recorded."""
    if is_master:
        return now - WORKER_REPORT_DELAY_S - min(tally.longest_s, FINAL_WAIT_MAX_S)
    oldest = run.oldest_in_flight()
    return now if oldest is None else min(oldest, now)


def print_final_lines(run: Run, settled: float, now: float, out: Callable[[str], None]) -> None:
    """Each ended step whose figures are final: its summary kept in run.final_steps, its line printed."""
    steps = run.plan.steps
    for phase in steps:
        if phase.index in run.final_steps:
            continue
        end = run.start_s + phase.end_s
        if now < end or (settled < end and now < end + FINAL_WAIT_MAX_S):
            return  # the steps' lines come in order
        samples = run.sampler.samples if run.sampler is not None else []
        step = summarize_step(run.settings, run.plan, phase, run.start_s, now, run.recorder, samples)
        if step is None:
            return
        run.final_steps[phase.index] = step
        out(progress_line(step, len(steps)))


def live_figures(run: Run, phase: Phase, tally: Tally, settled: float, now: float) -> LiveFigures:
    end = max(min(settled, now), now - MAX_LAG_S)
    start = max(end - RECENT_S, run.start_s + phase.start_s)  # this phase's tokens only
    tps = run.recorder.tokens_between(start, end) / (end - start) if end - start >= MIN_SPAN_S else None
    gpu = _recent_gpu(run, now - RECENT_S)
    return LiveFigures(
        output_tps=tps,
        gpu_util=sum(gpu) / len(gpu) if gpu else None,
        num_ok=tally.ok[phase.index],
        num_failed=tally.failed[phase.index],
    )


def _recent_gpu(run: Run, since: float) -> list[float]:
    """The GPU utilization samples taken since that wall-clock time (newest first)."""
    found: list[float] = []
    for sample in reversed(run.sampler.samples if run.sampler is not None else []):
        if sample.wall < since:
            break
        if sample.gpu_util is not None:
            found.append(sample.gpu_util)
    return found


def report_progress(run: Run, user_count: Callable[[], int], is_master: bool, progress_s: float) -> None:
    """The greenlet: final step lines as steps settle; a live line every progress_s (0: none)."""
    tally = Tally()
    due_s = next_live_s = time.monotonic()  # the first line at once: the warm-up (or the first step) has begun
    while True:
        due_s = max(due_s + TICK_S, time.monotonic())
        gevent.sleep(due_s - time.monotonic())
        if run.stopper.stopping:
            return  # the run ends with the reason, not with figures
        now = time.time()
        tally.update(run)
        settled = settled_until(run, tally, now, is_master)
        print_final_lines(run, settled, now, _say)
        phase = run.plan.phase_at(now - run.start_s)
        if progress_s <= 0 or phase is None or time.monotonic() < next_live_s:
            continue
        next_live_s = max(next_live_s + progress_s, time.monotonic() + TICK_S)
        figures = live_figures(run, phase, tally, settled, now)
        _say(live_line(run.settings, run.plan, phase, now - run.start_s, user_count(), figures))


def _say(line: str) -> None:
    print(line, flush=True)
