"""The load generator's own live metrics for Prometheus (zerogap_loadtest_*), served
at http://{metrics.exporter_host}:{metrics.exporter_port}/metrics by the master (or the
single local process), fed with every record, the workers' included."""

from __future__ import annotations

import logging
import urllib.request

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, make_wsgi_app

from loadreport.record import RequestRecord

log = logging.getLogger("zerogap.loadtest")

_BUCKETS_S = (
    0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5,
    0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 20.0, 30.0, 60.0,
)  # fmt: skip


def outcome_label(kind: str) -> str:
    """ "" -> "ok"; "HTTP 503" -> "http_503"; "broken stream" -> "broken_stream"."""
    return "ok" if not kind else kind.lower().replace(" ", "_")


class Exporter:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        reg = self.registry
        self.users = Gauge("zerogap_loadtest_users", "users running (all processes)", registry=reg)
        self.step = Gauge(
            "zerogap_loadtest_step",
            'the step running now, counted from 0 (the console\'s "step 1/N" is 0); -1: warm-up, or no test running',
            registry=reg,
        )
        self.num_steps = Gauge("zerogap_loadtest_num_steps", "the steps of the run (settings.json)", registry=reg)
        self.requests = Counter("zerogap_loadtest_requests", "requests finished, by outcome", ["outcome"], registry=reg)
        self.output_tokens = Counter("zerogap_loadtest_output_tokens", "output tokens received", registry=reg)
        self.prompt_tokens = Counter("zerogap_loadtest_prompt_tokens", "prompt tokens sent (usage)", registry=reg)
        self.ttft = Histogram("zerogap_loadtest_ttft_seconds", "time to first token", buckets=_BUCKETS_S, registry=reg)
        self.tpot = Histogram(
            "zerogap_loadtest_tpot_seconds", "time per output token", buckets=_BUCKETS_S, registry=reg
        )
        self.cpu = Gauge("zerogap_loadtest_cpu_percent", "load-generator CPU, by process", ["process"], registry=reg)
        gpu_help = "GPU utilization as the harness samples it (0 outside a run)"
        self.gpu = Gauge("zerogap_loadtest_gpu_util_percent", gpu_help, registry=reg)
        # the run's window, for the dashboards' default range (deploy/prometheus/console_libraries/zerogap.lib)
        start_help = "when the latest run started (unix seconds; 0: none yet)"
        self.run_start = Gauge("zerogap_loadtest_run_start_seconds", start_help, registry=reg)
        end_help = "when the latest run ends: its plan's end while it runs, then when it ended (unix seconds; 0: none)"
        self.run_end = Gauge("zerogap_loadtest_run_end_seconds", end_help, registry=reg)
        self.step.set(-1)  # no test running yet
        self._server: object | None = None

    def run_started(self, start_s: float, planned_end_s: float) -> None:
        self.run_start.set(start_s)
        self.run_end.set(planned_end_s)

    def run_stopped(self, end_s: float | None = None) -> None:
        """Outside a run the gauges say so (no users, no step, nothing sampled), not the run's last values;
        the run's end is when it ended (a run stopped early ends before its plan)."""
        self.users.set(0)
        self.step.set(-1)
        self.gpu.set(0)
        if end_s is not None:
            self.run_end.set(end_s)

    def observe(self, record: RequestRecord) -> None:
        self.requests.labels(outcome_label(record.error_kind)).inc()
        self.output_tokens.inc(record.output_tokens)
        self.prompt_tokens.inc(record.prompt_tokens)
        if record.ok and record.ttft_s is not None:
            self.ttft.observe(record.ttft_s)
        tpot = record.tpot_s
        if record.ok and tpot is not None:
            self.tpot.observe(tpot)

    def serve(self, host: str, port: int) -> str | None:
        """Start serving /metrics (gevent's WSGI server). When the port is taken, the message that refuses
        the run (None: serving): Prometheus scrapes this port by number, so another process there would
        put its numbers in this run's dashboards."""
        from gevent.pywsgi import WSGIServer

        server = WSGIServer((host, port), make_wsgi_app(self.registry), log=None)
        try:
            server.start()
        except OSError as exc:
            return taken_message(host, port, str(exc.strerror or exc))
        self._server = server
        log.info("zerogap: load-generator metrics at http://%s:%s/metrics", host, port)
        return None

    def close(self) -> None:
        if self._server is not None:
            self._server.stop(timeout=1)  # type: ignore[attr-defined]
            self._server = None


def _holder(host: str, port: int) -> str:
    """Who holds the port, as far as its /metrics tells: another load test of zerogap's, or some process."""
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=1) as response:
            if b"zerogap_loadtest_" in response.read(1 << 20):
                return "another zerogap load test (a Locust process still running?)"
    except (OSError, ValueError):
        pass
    return "another process"


def taken_message(host: str, port: int, why: str) -> str:
    return (
        f"metrics.exporter_port {port} on {host} is taken ({why}) by {_holder(host, port)}: Prometheus scrapes "
        f"that port, so this run's dashboards would show that process's numbers. Stop it, or set "
        f"metrics.exporter_port in settings.json to a free port and the zerogap-loadtest target in "
        f"deploy/prometheus/prometheus.yml to the same port (or metrics.exporter_port to 0: no load-generator metrics)"
    )
