"""The greenlets that run beside the users for one run: this process's CPU, and the server-side
timeline with the exporter's run gauges (master or local run). The progress lines:
loadgen/progress.py."""

from __future__ import annotations

import time
from collections.abc import Callable

import gevent
import psutil

from loadgen.exporter import Exporter
from loadgen.run import Run


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
    """The backends' signals (GPU, running, waiting, KV cache...) every sample interval. The exporter's
    users and step are set before each scrape (they are known then; a slow scrape would delay them),
    its GPU utilization from the scrape."""
    assert run.sampler is not None
    if exporter is not None:
        exporter.num_steps.set(len(run.plan.steps))
        exporter.run_started(run.start_s, run.start_s + run.plan.total_s)
    interval_s = run.settings.metrics.sample_interval_ms / 1000.0
    due_s = time.monotonic()
    while True:
        due_s = max(due_s + interval_s, time.monotonic())  # on the beat; a slow scrape is not added to it
        gevent.sleep(due_s - time.monotonic())
        users = user_count()
        if exporter is not None:
            exporter.users.set(users)
            phase = run.plan.phase_at(time.time() - run.start_s)
            exporter.step.set(phase.index if phase is not None else -1)
        sample = run.sampler.sample(users)
        if exporter is not None and sample.gpu_util is not None:
            exporter.gpu.set(sample.gpu_util)
