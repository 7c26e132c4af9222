"""The greenlets that run beside the users for one run: this process's CPU, the server-side
timeline (master or local run), and a progress line at the end of each step."""

from __future__ import annotations

import time
from collections.abc import Callable

import gevent
import psutil

from loadtest._console import progress_line
from loadtest._exporter import Exporter
from loadtest._run import Run
from loadtest._summary import summarize_step

WORKER_REPORT_DELAY_S = 4.0  # workers report every 3 s: a step's last records reach the master this late


def sample_cpu(run: Run, process_name: str, exporter: Exporter | None) -> None:
    """This process's CPU (percent of one core) every sample interval, for the load generator's own limit."""
    process = psutil.Process()
    process.cpu_percent(None)
    interval_s = run.settings.metrics.sample_interval_ms / 1000.0
    while True:
        gevent.sleep(interval_s)
        cpu = process.cpu_percent(None)
        run.recorder.add_cpu(process_name, time.time(), cpu)
        if exporter is not None:
            exporter.cpu.labels(process_name).set(cpu)


def sample_timeline(run: Run, user_count: Callable[[], int], exporter: Exporter | None) -> None:
    """The backends' signals (GPU, running, waiting, KV cache...) every sample interval."""
    assert run.sampler is not None
    interval_s = run.settings.metrics.sample_interval_ms / 1000.0
    due_s = time.monotonic()
    while True:
        due_s = max(due_s + interval_s, time.monotonic())  # on the beat; a slow scrape is not added to it
        gevent.sleep(due_s - time.monotonic())
        sample = run.sampler.sample(user_count())
        if exporter is not None:
            exporter.users.set(sample.users)
            phase = run.plan.phase_at(sample.wall - run.start_s)
            exporter.step.set(phase.index if phase is not None else -1)
            if sample.gpu_util is not None:
                exporter.gpu.set(sample.gpu_util)


def print_progress(run: Run, is_master: bool) -> None:
    """One line per finished step (the last step's comes with the table)."""
    assert run.sampler is not None
    delay_s = WORKER_REPORT_DELAY_S if is_master else 0.2
    steps = run.plan.steps
    for phase in steps[:-1]:
        gevent.sleep(max(0.0, run.start_s + phase.end_s + delay_s - time.time()))
        step = summarize_step(
            run.settings, run.plan, phase, run.start_s, time.time(), run.recorder, run.sampler.samples
        )
        if step is not None:
            print(progress_line(step, len(steps)), flush=True)
