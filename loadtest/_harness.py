"""The harness's state in one Locust process, and its answers to Locust's events.

Roles: a local run does everything in one process. With --processes N or
--master/--worker, workers run the users and ship their records to the master with
each stats report (report_to_master); the master samples the server-side signals,
serves the load generator's /metrics, and writes the run folder.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

import gevent
import psutil
from locust.env import Environment
from locust.runners import MasterRunner, Runner, WorkerRunner

from loadtest._arrivals import Arrivals
from loadtest._client import StreamClient
from loadtest._console import progress_line, table
from loadtest._exporter import Exporter
from loadtest._limits import raise_open_files
from loadtest._locust_stats import fire_locust_events
from loadtest._plan import Plan
from loadtest._prompt import calibrate, request_body, tokenize_counter, tokenize_urls
from loadtest._record import INTERRUPTED, Recorder, RequestRecord, TokensPerChunk
from loadtest._report import new_run_dir, write_run
from loadtest._retry import with_retries
from loadtest._settings import Settings, SettingsError, load_settings, settings_path
from loadtest._stopper import Stopper
from loadtest._summary import summarize_run, summarize_step
from loadtest._timeline import Sampler
from loadtest._webui import ZerogapTab, live_rows
from loadtest._workload import Session, Workload

log = logging.getLogger("zerogap.loadtest")
WIRE_KEY = "zerogap"
FINAL_WAIT_S = 12.0
FAILURE_PAUSE_S = 0.1
STOP_MESSAGE = "zerogap_stop"
FINAL_MESSAGE = "zerogap_final"
NONCE_SHAPE = "000000 "  # each prompt starts with a random 6-digit number: no two share a prefix cache entry


def fail(message: str) -> None:
    """A user error: the message, no traceback, exit status 2."""
    sys.stderr.write(f"zerogap loadtest: {message}\n")
    sys.stderr.flush()
    raise SystemExit(2)


class Harness:
    def __init__(self) -> None:
        self.settings: Settings | None = None
        self.plan: Plan | None = None
        self.env: Environment | None = None
        self.recorder = Recorder()
        self.exporter: Exporter | None = None
        self.headers: dict[str, str] = {}
        self.base_url = ""
        self.prompt = ""
        self.prompt_source = "approx"
        self.workload: Workload | None = None
        self.run_start = 0.0
        self.run_dir: Path | None = None
        self.sampler: Sampler | None = None
        self.arrivals: Arrivals | None = None
        self.greenlets: list[gevent.Greenlet] = []
        self.finals: set[str] = set()
        self.workers_seen: set[str] = set()
        self.started = False
        self.chunk_ratio = TokensPerChunk()
        self.model = ""
        self.stopper = Stopper("", {}, 0.0)
        self.process_name = f"{socket.gethostname()}:{os.getpid()}"

    # ----- roles -----
    @property
    def runner(self) -> Runner | None:
        return self.env.runner if self.env is not None else None

    @property
    def is_worker(self) -> bool:
        return isinstance(self.runner, WorkerRunner)

    @property
    def is_master(self) -> bool:
        return isinstance(self.runner, MasterRunner)

    # ----- init -----
    def on_init(self, environment: Environment, **_: Any) -> None:
        self.env = environment
        options = environment.parsed_options
        path = settings_path(getattr(options, "settings", None) if options is not None else None)
        try:
            settings = load_settings(path)
            api_key = settings.api_key()
        except SettingsError as exc:
            fail(str(exc))
            return
        self.settings, self.plan = settings, Plan.from_settings(settings.load_test)
        self.base_url = (environment.host or settings.api.base_url).rstrip("/")
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.process_name = f"{socket.gethostname()}:{os.getpid()}"
        if not self.is_master:
            raise_open_files(max(self.plan.users_for(p) for p in self.plan.phases) + 256)
        if not self.is_worker and settings.metrics.exporter_port:
            self.exporter = Exporter()
            self.exporter.serve(settings.metrics.exporter_host, settings.metrics.exporter_port)
        events = environment.events
        events.test_start.add_listener(self.on_test_start)
        events.test_stop.add_listener(self.on_test_stop)
        events.report_to_master.add_listener(self.on_report_to_master)
        events.worker_report.add_listener(self.on_worker_report)
        events.quitting.add_listener(self.on_quitting)
        self.register_messages()
        if not self.is_worker:
            ZerogapTab(self.live_rows).install(environment)
        log.info("zerogap: settings from %s; %s", path, self.describe_plan())

    def describe_plan(self) -> str:
        assert self.plan is not None
        loads = ", ".join(f"{step.load:g}" for step in self.plan.steps)
        unit = "req/s" if self.plan.open_loop else "users"
        return f"steps {loads} {unit}, {self.plan.total_s:g} s in all"

    # ----- start -----
    def on_test_start(self, environment: Environment, **_: Any) -> None:
        assert self.settings is not None and self.plan is not None
        self.recorder = Recorder()
        self.finals, self.workers_seen = set(), set()
        self.run_start = time.time()
        self.started = True
        self.base_url = (environment.host or self.settings.api.base_url).rstrip("/")  # the web UI may change it
        api = self.settings.api
        list_timeout_s = api.connect_timeout_seconds + self.settings.metrics.scrape_timeout_seconds
        self.stopper = Stopper(self.base_url, self.headers, list_timeout_s)
        if not self.is_worker:
            self.run_dir = new_run_dir(self.settings.output)
            self.sampler = Sampler(self.settings.metrics)
        model = self.stopper.choose_model(environment, self.settings.workload.model)
        if model is None:
            return
        self.model = model
        if not self.is_master:
            self.prepare_prompt()
            seed = self.settings.load_test.seed
            seed = None if seed is None else seed + os.getpid() * int(self.is_worker)
            self.arrivals = Arrivals(self.plan, self.run_start, self.user_share, seed) if self.plan.open_loop else None
            self.spawn(self.sample_cpu)
        if not self.is_worker:
            self.spawn(self.sample_timeline)
            self.spawn(self.print_progress)
            log.info("zerogap: this run writes %s", self.run_dir)

    def spawn(self, function: Any) -> None:
        self.greenlets.append(gevent.spawn(function))

    def prepare_prompt(self) -> None:
        assert self.settings is not None
        workload = self.settings.workload
        counter = None
        if workload.prompt_tokens_from == "tokenize":
            urls = tokenize_urls(self.base_url, workload.tokenize_url)
            counter = tokenize_counter(urls, self.model, self.settings.metrics.scrape_timeout_seconds)
        prefix = NONCE_SHAPE if workload.unique_prompts else ""
        self.prompt, self.prompt_source = calibrate(workload.prompt_tokens, counter, prefix)
        self.workload = Workload(self.settings, self.prompt, self.settings.load_test.seed)
        if workload.prompt_tokens_from == "tokenize" and self.prompt_source != "tokenize":
            log.warning("zerogap: no /tokenize answered; prompts use the approximation (one word = one token)")

    def user_share(self) -> float:
        assert self.plan is not None
        runner = self.runner
        count = runner.user_count if runner is not None else 0
        return min(1.0, count / self.plan.concurrency) if self.is_worker else 1.0

    # ----- the users' side -----
    def new_client(self) -> StreamClient:
        assert self.settings is not None
        api = self.settings.api
        stream = self.settings.workload.stream
        return StreamClient(
            self.base_url, api.path(), self.headers, api.connect_timeout_seconds, api.timeout_seconds, stream
        )

    def new_session(self) -> Session | None:
        """A user's own prefix and conversation, for the shared-prefix and multi-turn workloads."""
        if self.workload is None or not self.workload.shaped:
            return None
        return self.workload.session()

    def body(self, session: Session | None = None) -> bytes:
        assert self.settings is not None
        if session is not None:
            return session.body(self.model)
        return request_body(self.settings, self.prompt, self.model)

    def run_one(self, client: StreamClient, session: Session | None = None) -> None:
        assert self.settings is not None and self.env is not None
        if self.stopper.stopping:
            gevent.sleep(FAILURE_PAUSE_S)
            return
        lag = None
        if self.arrivals is not None:
            planned = self.arrivals.take()
            lag = max(0.0, time.time() - planned)
        body = self.body(session)
        record, walls, detail = with_retries(
            lambda: client.stream(body, lag, self.keep_interrupted), self.settings.api.max_retries
        )
        if session is not None and record.ok:
            session.answered(record.output_tokens)
        self.keep(record, walls)
        fire_locust_events(self.env, client.path, record, detail)
        if not self.is_worker:
            self.stopper.observe(self.env, record, detail)
        if not record.ok and self.arrivals is None:
            gevent.sleep(FAILURE_PAUSE_S)  # a dead or refusing server is not hammered in a tight loop

    def keep_interrupted(self, record: RequestRecord, walls: list[float]) -> None:
        self.keep(record, walls)

    def keep(self, record: RequestRecord, walls: list[float]) -> None:
        self.chunk_ratio.apply(record, walls)
        self.recorder.add(record, walls)
        if self.exporter is not None:
            self.exporter.observe(record)

    # ----- sampling -----
    def sample_cpu(self) -> None:
        assert self.settings is not None
        process = psutil.Process()
        process.cpu_percent(None)
        interval_s = self.settings.metrics.sample_interval_ms / 1000.0
        while True:
            gevent.sleep(interval_s)
            cpu = process.cpu_percent(None)
            self.recorder.add_cpu(self.process_name, time.time(), cpu)
            if self.exporter is not None:
                self.exporter.cpu.labels(self.process_name).set(cpu)

    def sample_timeline(self) -> None:
        assert self.settings is not None and self.plan is not None and self.sampler is not None
        interval_s = self.settings.metrics.sample_interval_ms / 1000.0
        while True:
            gevent.sleep(interval_s)
            runner = self.runner
            sample = self.sampler.sample(runner.user_count if runner is not None else 0)
            if self.exporter is not None:
                self.exporter.users.set(sample.users)
                phase = self.plan.phase_at(sample.wall - self.run_start)
                self.exporter.step.set(phase.index if phase is not None else -1)
                if sample.gpu_util is not None:
                    self.exporter.gpu.set(sample.gpu_util)

    def print_progress(self) -> None:
        assert self.settings is not None and self.plan is not None and self.sampler is not None
        delay_s = 4.0 if self.is_master else 0.2  # workers report every 3 s
        steps = self.plan.steps
        for phase in steps[:-1]:  # the last step's line comes with the table
            gevent.sleep(max(0.0, self.run_start + phase.end_s + delay_s - time.time()))
            step = summarize_step(
                self.settings, self.plan, phase, self.run_start, time.time(), self.recorder, self.sampler.samples
            )
            if step is not None:
                print(progress_line(step, len(steps)), flush=True)

    def live_rows(self) -> list[dict[str, Any]]:
        if not self.started or self.settings is None or self.plan is None or self.sampler is None:
            return []
        return live_rows(self.settings, self.plan, self.run_start, self.recorder, self.sampler.samples)

    # ----- master <-> workers -----
    def register_messages(self) -> None:
        runner = self.runner
        if isinstance(runner, WorkerRunner):
            runner.register_message(STOP_MESSAGE, self.on_stop_message)
        elif isinstance(runner, MasterRunner):
            runner.register_message(FINAL_MESSAGE, self.on_final_message)

    def on_report_to_master(self, client_id: str, data: dict[str, Any], **_: Any) -> None:
        data[WIRE_KEY] = self.wire()

    def wire(self) -> dict[str, Any]:
        wire = self.recorder.drain()
        wire["prompt_source"] = self.prompt_source
        return wire

    def on_worker_report(self, client_id: str, data: dict[str, Any], **_: Any) -> None:
        wire = data.get(WIRE_KEY)
        if wire:
            self.ingest(wire)

    def ingest(self, wire: dict[str, Any]) -> None:
        self.prompt_source = str(wire.get("prompt_source", self.prompt_source))
        records = self.recorder.ingest(wire)
        if self.env is not None:
            for record in records:
                self.stopper.observe(self.env, record, "")
        if self.exporter is not None:
            for record in records:
                self.exporter.observe(record)
            for process, samples in (wire.get("cpu") or {}).items():
                if samples:
                    self.exporter.cpu.labels(process).set(float(samples[-1][1]))

    def on_stop_message(self, environment: Environment, msg: Any, **_: Any) -> None:
        """Worker: the master is finishing the run; stop the users and send the rest now."""
        runner = self.runner
        assert isinstance(runner, WorkerRunner)
        runner.stop()
        runner.send_message(FINAL_MESSAGE, {"client_id": runner.client_id, WIRE_KEY: self.wire()})

    def on_final_message(self, environment: Environment, msg: Any, **_: Any) -> None:
        data = msg.data or {}
        self.ingest(data.get(WIRE_KEY) or {})
        self.finals.add(str(data.get("client_id", msg.node_id)))

    # ----- stop -----
    def on_test_stop(self, environment: Environment, **_: Any) -> None:
        run_end = time.time()
        if not self.started:
            return  # Locust fires test_stop when quitting a web UI that never started a test
        self.started = False
        for greenlet in self.greenlets:
            greenlet.kill(block=False)
        self.greenlets = []
        if self.is_worker:
            return
        if isinstance(self.runner, MasterRunner):
            self.collect_from_workers(self.runner)
        self.finish(run_end)

    def collect_from_workers(self, runner: MasterRunner) -> None:
        """Ask every worker to stop and send what it has; wait for all of them (bounded)."""
        expected = {client.id for client in runner.clients.all}
        self.finals = set()
        runner.send_message(STOP_MESSAGE)
        deadline = time.time() + FINAL_WAIT_S
        while time.time() < deadline and not expected <= self.finals:
            gevent.sleep(0.05)
        self.workers_seen = expected
        missing = expected - self.finals
        if missing:
            log.warning("zerogap: %d worker(s) sent no final report; their last seconds may be missing", len(missing))

    def finish(self, run_end: float) -> None:
        assert self.settings is not None and self.plan is not None and self.sampler is not None
        assert self.run_dir is not None
        summary = summarize_run(self.settings, self.plan, self.run_start, run_end, self.recorder, self.sampler.samples)
        meta = {
            "base_url": self.base_url,
            "model": self.model,
            "stopped_early": self.stopper.reason or None,
            "endpoint": self.settings.api.path(),
            "mode": "open_loop" if self.plan.open_loop else "closed_loop",
            "prompt_tokens_from": self.prompt_source,
            "num_worker_processes": len(self.workers_seen) if self.is_master else 1,
            "interrupted_requests": sum(1 for r in self.recorder.records if r.error_kind == INTERRUPTED),
        }
        report_html = write_run(
            self.run_dir, self.settings, self.plan, self.run_start, run_end, summary, meta, self.recorder,
            self.sampler.samples,
        )  # fmt: skip
        if summary["steps"]:
            print(progress_line(summary["steps"][-1], len(self.plan.steps)), flush=True)
        print(table(summary), flush=True)
        print(f"zerogap report: {report_html}", flush=True)

    def on_quitting(self, environment: Environment, **_: Any) -> None:
        if self.exporter is not None:
            self.exporter.close()
