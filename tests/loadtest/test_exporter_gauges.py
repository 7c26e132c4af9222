"""The load generator's run gauges (zerogap_loadtest_users, _step, _num_steps, _gpu_util_percent)
around one run of the real `locust -f loadtest/` web UI: before the test no step runs (-1); while
the harness's first scrape of the backends is held open by this test, the step already reads the
run's first step (it is set before the scrape, not when the scrape returns); the number of steps
is settings.json's; and once the run has ended, users, step and GPU read 0, -1 and 0, not the run's
last values."""

from __future__ import annotations

import json
import subprocess
import threading
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from common.net import free_port, wait_for_port
from common.process_group import stop_process
from tests.fixtures.upstream import Behavior, UpstreamServer
from tests.loadtest.helpers import LOCUST, write_settings
from tests.support import REPO, QuietHandler, serving, wait_until

pytestmark = pytest.mark.slow

BUSY_RATIO = 0.5  # the engine's GPU busy ratio: the harness exports 50 %
WAIT_S = 60.0  # generous: the machine is busy


class HeldMetrics:
    """A backend /metrics whose first scrape is held until release(); the ones after answer at once."""

    def __init__(self) -> None:
        self.arrived = threading.Event()
        self.released = threading.Event()
        self.url = ""
        held = self

        class Handler(QuietHandler):
            def do_GET(self) -> None:
                held.arrived.set()
                held.released.wait(WAIT_S)
                self.reply(200, f'zerogap_sim_gpu_busy_ratio{{model_name="m"}} {BUSY_RATIO}\n'.encode(), "text/plain")

        self._serving = serving(Handler)

    def __enter__(self) -> HeldMetrics:
        self.url = self._serving.__enter__() + "/metrics"
        return self

    def __exit__(self, *exc: object) -> None:
        self.released.set()
        self._serving.__exit__(None, None, None)


def gauges(port: int) -> dict[str, float]:
    """The exporter's unlabelled gauges: name -> value. A scrape waits while the harness's process
    is busy (it renders the report's plots in one go: over 10 s once in a loaded CI run)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=WAIT_S) as resp:
        text = resp.read().decode()
    values = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name.startswith("zerogap_loadtest_") and "{" not in name:
            values[name] = float(value)
    return values


@pytest.fixture
def web_ui(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], int, int, HeldMetrics, Path]]:
    with UpstreamServer(Behavior(num_output_tokens=4)) as upstream, HeldMetrics() as held:
        exporter_port, web_port = free_port(), free_port()
        settings = write_settings(
            tmp_path / "settings.json", upstream.url, tmp_path / "runs", "gauges",
            load_test={"steps": [1, 1], "warmup_seconds": 0, "step_duration_seconds": 2, "measure_last_seconds": 1},
            workload={"model": upstream.state.model, "prompt_tokens_from": "approx"},
            metrics={"backend_metrics_urls": [held.url], "exporter_port": exporter_port, "scrape_timeout_seconds": 90},
        )  # fmt: skip
        cmd = [LOCUST, "-f", str(REPO / "loadtest"), "--settings", str(settings), "--web-host", "127.0.0.1",
               "--web-port", str(web_port)]  # fmt: skip
        log = tmp_path / "locust.log"
        with log.open("wb") as sink:
            proc = subprocess.Popen(cmd, cwd=REPO, stdout=sink, stderr=subprocess.STDOUT)
        try:
            wait_for_port(web_port, timeout_s=WAIT_S, proc=proc)
            wait_for_port(exporter_port, timeout_s=WAIT_S, proc=proc)
            yield proc, web_port, exporter_port, held, log
        finally:
            stop_process(proc)


def test_run_gauges_before_during_and_after_a_run(
    web_ui: tuple[subprocess.Popen[bytes], int, int, HeldMetrics, Path],
) -> None:
    proc, web_port, exporter_port, held, log = web_ui
    before = gauges(exporter_port)
    assert (before["zerogap_loadtest_users"], before["zerogap_loadtest_step"]) == (0, -1), before

    form = urllib.parse.urlencode({"user_count": 1, "spawn_rate": 1}).encode()
    with urllib.request.urlopen(f"http://127.0.0.1:{web_port}/swarm", data=form, timeout=10) as resp:
        assert json.load(resp)["success"] is True
    assert held.arrived.wait(WAIT_S), log.read_text()[-3000:]
    during = gauges(exporter_port)  # the first scrape is in flight: nothing after it has run
    held.released.set()
    assert during["zerogap_loadtest_step"] == 0, during  # the first step, counted from 0
    assert during["zerogap_loadtest_num_steps"] == 2, during
    wait_until(lambda: gauges(exporter_port)["zerogap_loadtest_gpu_util_percent"] == 50.0, "the GPU sampled", WAIT_S)
    wait_until(lambda: gauges(exporter_port)["zerogap_loadtest_users"] == 1, "users running", WAIT_S)

    report = log.parent / "runs" / "gauges" / "report.html"  # written at the test's stop, after the gauges, last
    wait_until(lambda: report.exists() or proc.poll() is not None, "the run's report", WAIT_S)
    after = gauges(exporter_port)
    assert after["zerogap_loadtest_users"] == 0, after
    assert after["zerogap_loadtest_step"] == -1, after
    assert after["zerogap_loadtest_gpu_util_percent"] == 0, after
    assert after["zerogap_loadtest_num_steps"] == 2, after  # the run's plan, still readable
    assert "Traceback" not in log.read_text()
