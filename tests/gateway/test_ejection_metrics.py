"""zerogap_backend_ejections_total and zerogap_outlier_pending_dropped_total with --workers N:
each worker process writes its own counts in the multiprocess folder, and /metrics (any worker)
answers their sum, one series per backend and cause, not one per process."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

from gateway.observe.metrics import GatewayMetrics
from gateway.pool.model_pool import Router
from tests.gateway.helpers import metric

WORKER = """
from gateway.observe.metrics import GatewayMetrics
from gateway.pool.model_pool import Backend
metrics = GatewayMetrics("{folder}")
backend = Backend("a", "http://127.0.0.1:1", "m")
metrics.ejected(backend, "outlier")
metrics.outlier_dropped(backend, 2)
"""


async def test_ejections_are_summed_over_the_worker_processes(tmp_path) -> None:
    folder = tmp_path / "prometheus"
    folder.mkdir()
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(folder)}
    for _ in range(3):  # three workers, one ejection each
        cmd = [sys.executable, "-c", WORKER.format(folder=folder)]
        await asyncio.to_thread(subprocess.run, cmd, env=env, check=True, timeout=60)
    text = GatewayMetrics(str(folder)).render(Router([], "least_load"))  # what any worker answers (in a loop)
    assert metric(text, "zerogap_backend_ejections_total", backend="a", cause="outlier") == 3
    assert metric(text, "zerogap_outlier_pending_dropped_total", backend="a") == 6
    assert text.count(b'zerogap_backend_ejections_total{backend="a"') == 1  # one series, no pid label
