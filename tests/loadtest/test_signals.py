"""GPU utilization and backend signals from real HTTP endpoints (and NVML where a GPU is)."""

from __future__ import annotations

import contextlib
import socketserver
import subprocess
import sys
import threading
import time

from common.net import free_port
from loadgen.signals import CPU_INTERVAL, TOKEN_INTERVAL, GpuUtil, scrape_backends
from loadreport.settings import MetricsSection
from tests.fixtures.upstream import Behavior, UpstreamServer
from tests.loadtest.backend_metrics import SignalServer
from tests.support import REPO


def test_backend_metrics_and_prometheus_sources() -> None:
    with SignalServer(busy_ratio=0.6, token_interval_s=0.0005, dcgm_percent=70.0, cpu_interval_s=0.014) as signals:
        urls = [f"{signals.url}/metrics", f"{signals.url}/metrics"]
        metrics = MetricsSection(backend_metrics_urls=urls)
        gpu = GpuUtil(metrics)
        scrape = scrape_backends(urls, gpu.metric_names() | {TOKEN_INTERVAL, CPU_INTERVAL}, 2.0)
        assert gpu.sample(scrape) == (60.0, "")
        assert scrape.mean(TOKEN_INTERVAL) == 0.0005 and scrape.mean(CPU_INTERVAL) == 0.014
        prom = GpuUtil(MetricsSection(gpu_util={"source": "prometheus", "prometheus_url": signals.url}))
        assert prom.sample(scrape) == (70.0, "")


def test_unavailable_sources_give_null_with_the_reason() -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    metrics = MetricsSection(backend_metrics_urls=[f"{dead}/metrics"], scrape_timeout_seconds=0.5)
    gpu = GpuUtil(metrics)
    value, reason = gpu.sample(scrape_backends(metrics.backend_metrics_urls or [], gpu.metric_names(), 0.5))
    assert value is None and dead in reason
    assert GpuUtil(MetricsSection()).sample(scrape_backends([], set(), 0.5)) == (
        None,
        "metrics.backend_metrics_urls is empty",
    )
    source = {"source": "prometheus", "prometheus_url": dead}
    prom = GpuUtil(MetricsSection(gpu_util=source, scrape_timeout_seconds=0.5))
    assert prom.sample(scrape_backends([], set(), 0.5))[1].startswith("prometheus query failed")
    none = GpuUtil(MetricsSection(gpu_util={"source": "none"}))
    assert none.sample(scrape_backends([], set(), 0.5)) == (None, 'metrics.gpu_util.source is "none"')


def test_nvml_reads_a_local_gpu_or_says_why_not() -> None:
    value, reason = GpuUtil(MetricsSection(gpu_util={"source": "nvml"})).sample(scrape_backends([], set(), 0.5))
    if value is None:  # no GPU or no driver on this machine
        assert reason.startswith("nvml: ")
    else:
        assert 0.0 <= value <= 100.0 and reason == ""


def test_vllm_queue_gauges_are_summed_over_backends() -> None:
    with (
        UpstreamServer(Behavior(extra_running=3, extra_waiting=2)) as one,
        UpstreamServer(Behavior(extra_running=1)) as two,
    ):
        urls = [f"{one.url}/metrics", f"{two.url}/metrics"]
        scrape = scrape_backends(urls, {"vllm:num_requests_running", "vllm:num_requests_waiting"}, 2.0)
        assert scrape.total("vllm:num_requests_running") == 4.0
        assert scrape.total("vllm:num_requests_waiting") == 2.0


class _Trickle(socketserver.BaseRequestHandler):
    """A /metrics that answers in pieces, one every 0.3 s for 3 s: each socket read is quick."""

    def handle(self) -> None:
        self.request.recv(65536)
        self.request.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 400\r\n\r\n")
        for _ in range(10):
            time.sleep(0.3)
            with contextlib.suppress(OSError):
                self.request.sendall(b"# " + b"x" * 37 + b"\n")


SCRAPE_UNDER_GEVENT = """
from gevent import monkey; monkey.patch_all()
import sys, time
from loadgen.signals import RUNNING, scrape_backends
started = time.monotonic()
scrape = scrape_backends(sys.argv[1:], {RUNNING}, 1.0)
print(f"{time.monotonic() - started:.3f}", scrape.total(RUNNING), scrape.errors)
"""


def test_a_server_that_answers_in_pieces_is_cut_at_the_timeout() -> None:
    """Under gevent (as in Locust) a scrape takes timeout_s at most in all, however the answer
    comes, and the backends are scraped at once: the healthy one is read, the slow one is an error."""
    with (
        socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Trickle) as slow,
        UpstreamServer(Behavior(extra_running=3)) as fine,
    ):
        slow.daemon_threads = True
        threading.Thread(target=slow.serve_forever, daemon=True).start()
        slow_url = f"http://127.0.0.1:{slow.server_address[1]}/metrics"
        cmd = [sys.executable, "-c", SCRAPE_UNDER_GEVENT, slow_url, slow_url, f"{fine.url}/metrics"]
        done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=30, check=False)
        slow.shutdown()
    assert done.returncode == 0, done.stderr[-2000:]
    elapsed_s, running, errors = done.stdout.split(" ", 2)
    assert float(elapsed_s) < 1.5, done.stdout  # 3 s without the overall deadline; 2 s one backend after the other
    assert float(running) >= 3.0 and errors.count("no complete answer within 1 s") == 2, done.stdout
