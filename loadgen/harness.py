"""The harness in one Locust process: its answers to Locust's events, and the users' side.

Roles: a local run does everything in one process. With --processes N or
--master/--worker, workers run the users and ship their records to the master
(loadgen/workers.py); the master samples the server-side signals, serves the load
generator's /metrics, and writes the run folder. A trace is shared by the workers, from the
master's time 0 (loadgen/trace_share.py). One run's state is a Run (loadgen/run.py),
created when the run starts; the greenlets beside the users are in loadgen/sampling.py.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

import gevent
from locust.env import Environment
from locust.runners import MasterRunner, Runner, WorkerRunner

from loadgen.arrivals import Arrivals
from loadgen.client import StreamClient
from loadgen.dataset_source import DatasetSession
from loadgen.datasets import DataFileError
from loadgen.ending import RunEnding
from loadgen.exporter import Exporter
from loadgen.failfast import doubled_v1
from loadgen.locust_options import progress_seconds, quiet_locust_table, quiet_spawn_rate_warning
from loadgen.locust_stats import fire_locust_events
from loadgen.loop_lag import probe_loop_lag
from loadgen.open_files import raise_open_files
from loadgen.progress import report_progress
from loadgen.prompt import calibrate, request_body, tokenize_counter, tokenize_urls
from loadgen.retry import with_retries
from loadgen.run import Prompt, Run
from loadgen.sampler import Sampler
from loadgen.sampling import sample_cpu, sample_timeline
from loadgen.spawn_pacer import SpawnPacer
from loadgen.stopper import Stopper
from loadgen.trace_share import TraceShare
from loadgen.traffic import Traffic
from loadgen.webui import ZerogapTab, ignored_form_values, live_rows, prefill_form
from loadgen.workers import WorkerLink
from loadgen.workload import Session, Workload
from loadreport.record import RequestRecord
from loadreport.report import new_run_dir
from loadreport.schedule import LoadSchedule
from loadreport.settings import Settings, SettingsError, load_settings, settings_path

log = logging.getLogger("zerogap.loadtest")
FAILURE_PAUSE_S = 0.1
IDLE_S = 0.05  # a trace's user with no row left to send waits this long before it looks again
UserSession = Session | DatasetSession
NONCE_SHAPE = "000000 "  # each prompt starts with a random 6-digit number: no two share a prefix cache entry


def fail(message: str) -> None:
    """A user error: the message, no traceback, exit status 2."""
    sys.stderr.write(f"zerogap loadtest: {message}\n")
    sys.stderr.flush()
    raise SystemExit(2)


class Harness:
    """Set up from settings.json at Locust's init; a Run from each test_start to its test_stop."""

    def __init__(self) -> None:
        self.settings: Settings | None = None  # None until init (or when settings.json was refused)
        self.plan: LoadSchedule | None = None
        self.traffic: Traffic | None = None
        self.env: Environment | None = None
        self.exporter: Exporter | None = None
        self.link: WorkerLink | None = None
        self.share = TraceShare(lambda: self.run)
        self.ending: RunEnding | None = None
        self.headers: dict[str, str] = {}
        self.base_url = ""
        self.run: Run | None = None
        self.pacer = SpawnPacer(0.0, one_process=True)
        self.process_name = f"{socket.gethostname()}:{os.getpid()}"

    @property
    def runner(self) -> Runner | None:
        return self.env.runner if self.env is not None else None

    @property
    def is_worker(self) -> bool:
        return isinstance(self.runner, WorkerRunner)

    @property
    def is_master(self) -> bool:
        return isinstance(self.runner, MasterRunner)

    def on_init(self, environment: Environment, **_: Any) -> None:
        self.env = environment
        options = environment.parsed_options
        path = settings_path(getattr(options, "settings", None) if options is not None else None)
        try:
            settings = load_settings(path)
            api_key = settings.api_key()
            self.traffic = Traffic.read(settings)
        except (SettingsError, DataFileError) as exc:
            fail(str(exc))
            return
        self.settings = settings
        self.plan = self.traffic.schedule() or LoadSchedule.from_settings(settings.load_test)
        spawn_rate = 0.0 if self.plan.open_loop else self.plan.spawn_rate  # open loop: the arrivals pace
        self.pacer = SpawnPacer(spawn_rate, one_process=not self.is_worker)
        self.base_url = (environment.host or settings.api.base_url).rstrip("/")
        doubled = self.doubled_v1(environment)
        if doubled is not None:
            fail(doubled)
        quiet_locust_table(options)
        quiet_spawn_rate_warning()  # the harness paces its users itself (loadgen/spawn_pacer.py)
        prefill_form(options, self.plan)
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.process_name = f"{socket.gethostname()}:{os.getpid()}"
        if not self.is_master:
            raise_open_files(max(self.plan.users_for(p) for p in self.plan.phases) + 256)
        if not self.is_worker and settings.metrics.exporter_port:
            self.exporter = Exporter()
            taken = self.exporter.serve(settings.metrics.exporter_host, settings.metrics.exporter_port)
            if taken is not None:
                fail(taken)
        events = environment.events
        events.test_start.add_listener(self.on_test_start)
        events.test_stop.add_listener(self.on_test_stop)
        events.spawning_complete.add_listener(self.on_spawned)
        events.quitting.add_listener(self.on_quitting)
        self.ending = RunEnding(environment)
        events.quit.add_listener(self.ending.on_quit)
        self.link = WorkerLink(environment, lambda: self.run, self.exporter)
        self.link.install(self.runner)
        self.share.install(self.runner)
        if not self.is_worker:
            ZerogapTab(self.live_rows).install(environment)
        log.info("zerogap: settings from %s; %s", path, self.describe_plan(self.plan))

    def doubled_v1(self, environment: Environment) -> str | None:
        """The fix when the base URL (settings.json's, Locust's -H, or the web UI's host) ends in /v1."""
        assert self.settings is not None
        source = "the host (Locust's -H / the web UI's Host)" if environment.host else "api.base_url"
        return doubled_v1(self.base_url, self.settings.api.path(), source)

    @staticmethod
    def describe_plan(plan: LoadSchedule) -> str:
        loads = ", ".join(f"{step.load:g}" for step in plan.steps)
        unit = "req/s" if plan.open_loop else "users"
        return f"steps {loads} {unit}, {plan.total_s:g} s in all"

    # ----- start -----
    def on_test_start(self, environment: Environment, **_: Any) -> None:
        settings, plan = self.settings, self.plan
        assert settings is not None and plan is not None, "on_init refused the settings"
        self.base_url = (environment.host or settings.api.base_url).rstrip("/")  # the web UI may change it
        list_timeout_s = settings.api.connect_timeout_seconds + settings.metrics.scrape_timeout_seconds
        run = Run(settings, plan, self.base_url, Stopper(self.base_url, self.headers, list_timeout_s))
        if not self.is_worker:
            run.run_dir = new_run_dir(settings.output)
            run.sampler = Sampler(settings.metrics, self.base_url)
        self.run = run
        ignored = ignored_form_values(environment.parsed_options, plan)
        if ignored is not None and not self.is_worker:
            log.warning("zerogap: %s", ignored)
        doubled = self.doubled_v1(environment)
        if doubled is not None:
            run.stopper.stop(environment, doubled)
            return
        model = run.stopper.choose_model(environment, settings.workload.model)
        if model is None:
            return
        run.model = model
        trace = self.traffic.trace if self.traffic is not None else None
        if trace is not None:
            run.trace_rows = len(trace.rows)
            run.planned_lengths = self.traffic.planned_lengths() if self.traffic is not None else None
        if not self.is_master:
            run.prompt = self.prepare_prompt(run)
            if self.is_worker and run.replay is not None:
                run.replay.start_wait_s = None  # time 0 is the master's (loadgen/trace_share.py)
                self.share.apply(run)
            seed = settings.load_test.seed
            seed = None if seed is None else seed + os.getpid() * int(self.is_worker)
            run.arrivals = Arrivals(plan, run.start_s, self.user_share, seed) if plan.open_loop else None
            self.spawn(run, lambda: sample_cpu(run, self.process_name, self.exporter))
            self.spawn(run, lambda: probe_loop_lag(run.recorder, self.process_name))
        if not self.is_worker:
            self.spawn(run, lambda: sample_timeline(run, self.user_count, self.exporter))
            progress_s = progress_seconds(environment.parsed_options)
            self.spawn(run, lambda: report_progress(run, self.user_count, self.is_master, progress_s))
            log.info("zerogap: this run writes %s", run.run_dir)

    def on_spawned(self, **_: Any) -> None:
        """The users have started (on a master: every worker's): a trace's time 0 (the run's start, in its
        report), which a master sends its workers with their shares of the trace."""
        run = self.run
        if run is None or not run.trace_rows:
            return
        if isinstance(self.runner, MasterRunner):
            now = time.time()
            if self.share.announce(self.runner, run, now):
                run.start_s = now
        elif run.replay is not None and not self.is_worker and not run.replay.started.is_set():
            run.replay.start(time.time())
            run.start_s = run.replay.run_start

    @staticmethod
    def spawn(run: Run, function: Callable[[], None]) -> None:
        run.greenlets.append(gevent.spawn(function))

    def prepare_prompt(self, run: Run) -> Prompt:
        workload = run.settings.workload
        counter = None
        if workload.prompt_tokens_from == "tokenize":
            urls = tokenize_urls(self.base_url, workload.tokenize_url)
            timeout_s = run.settings.metrics.scrape_timeout_seconds
            counter = tokenize_counter(urls, run.model, timeout_s, self.headers, workload.tokenize_url)
        if self.traffic is not None and (self.traffic.dataset or self.traffic.trace):
            offset = self.runner.worker_index if isinstance(self.runner, WorkerRunner) else 0
            return Prompt("", self.traffic.prepare(run, counter, offset))
        prefix = NONCE_SHAPE if workload.unique_prompts else ""
        text, source = calibrate(workload.prompt_tokens, counter, prefix)
        if workload.prompt_tokens_from == "tokenize" and source != "tokenize":
            log.warning("zerogap: no /tokenize answered; prompts use the approximation (one word = one token)")
        return Prompt(text, source, Workload(run.settings, text, run.settings.load_test.seed))

    def user_count(self) -> int:
        runner = self.runner
        return runner.user_count if runner is not None else 0

    def user_share(self) -> float:
        assert self.plan is not None
        return min(1.0, self.user_count() / self.plan.concurrency) if self.is_worker else 1.0

    # ----- the users' side -----
    def new_client(self) -> StreamClient:
        assert self.settings is not None
        api = self.settings.api
        stream = self.settings.workload.stream
        path = self.traffic.api_path() if self.traffic is not None else api.path()
        timeouts = (api.connect_timeout_seconds, api.timeout_seconds)
        return StreamClient(self.base_url, path, self.headers, *timeouts, stream, traced=api.traceparent)

    def wait_turn(self) -> None:
        """A starting user's wait for its turn at the spawn rate (loadgen/spawn_pacer.py)."""
        self.pacer.wait_turn()

    def new_session(self) -> UserSession | None:
        """A user's own prefix and conversation (shared-prefix and multi-turn workloads), or its place in a dataset."""
        if self.run is not None and self.run.bodies is not None:
            return DatasetSession(self.run.bodies)
        workload = self.run.prompt.workload if self.run is not None else None
        if workload is None or not workload.shaped:
            return None
        return workload.session()

    def tick(self, run_time_s: float) -> tuple[int, float] | None:
        """The shape's users now; None at the end (a trace's run ends once its last request has ended)."""
        trace_done = self.run is not None and self.run.trace_done()
        ticked = None if self.plan is None or trace_done else self.plan.tick(run_time_s)
        if ticked is None and self.run is not None and self.ending is not None:
            self.ending.plan_ended(self.run, self.is_master)  # the users finish their streams, not cut
        return ticked

    def run_one(self, client: StreamClient, session: UserSession | None = None) -> None:
        run, env = self.run, self.env
        if run is None or env is None or run.stopper.stopping:
            gevent.sleep(FAILURE_PAUSE_S)
            return
        planned: float | None = None  # open loop: the planned send
        if run.replay is not None:
            taken = run.replay.take()
            if taken is None:
                gevent.sleep(IDLE_S)
                return
            planned, row, body = taken
            line = row.line
        else:
            planned = run.arrivals.take() if run.arrivals is not None else None
            body = session.body(run.model) if session else request_body(run.settings, run.prompt.text, run.model)
            line = session.last_line if isinstance(session, DatasetSession) else 0

        def keep(record: RequestRecord, walls: list[float]) -> None:  # also an interrupted request's
            record.line = line
            self.keep(run, record, walls)

        request_id = run.request_sent()  # the step's final line waits for the requests still streaming
        try:
            record, walls, detail = with_retries(
                lambda: client.stream(body, planned, keep), run.settings.api.max_retries
            )
            if session is not None and record.ok:
                session.answered(record.output_tokens)
            keep(record, walls)
        finally:
            run.request_kept(request_id)
            if run.replay is not None:
                run.replay.answered()
        if not record.ok:
            run.recorder.note_error(record.error_kind, detail)  # shipped to the master with the records
        fire_locust_events(env, client.path, record, detail)
        if not self.is_worker:
            run.stopper.observe(env, record, detail)
        if not record.ok and run.arrivals is None:
            gevent.sleep(FAILURE_PAUSE_S)  # a dead or refusing server is not hammered in a tight loop

    def keep(self, run: Run, record: RequestRecord, walls: list[float]) -> None:
        run.keep(record, walls)
        if self.exporter is not None:
            self.exporter.observe(record)

    def live_rows(self) -> list[dict[str, Any]]:
        run = self.run
        if run is None or run.sampler is None:
            return []
        return live_rows(run.settings, run.plan, run.start_s, run.recorder, run.sampler.samples, run.final_steps)

    # ----- stop -----
    def on_test_stop(self, environment: Environment, **_: Any) -> None:
        run = self.run
        if run is None:
            return  # Locust fires test_stop when quitting a web UI that never started a test
        end_s = run.ended_s or time.time()  # the streams that finished after the plan's end are not in its time
        if self.ending is not None:
            self.ending.run_stopped()
        run.stop_greenlets()
        if self.exporter is not None:
            self.exporter.run_stopped(end_s)  # after the greenlets that set the gauges
        if self.is_worker:
            self.run = None
            return
        if isinstance(self.runner, MasterRunner) and self.link is not None:
            run.num_workers = self.link.collect(self.runner, run.drain_s)  # their last records come into this run
        if run.trace_rows:  # the trace's one step lasted until its last answer (not the shape's next tick)
            end_s = min(end_s, run.trace_end_s() or end_s)
            run.plan = run.plan.cut_at(end_s - run.start_s)
            if self.is_master and self.traffic is not None:
                run.source = self.traffic.source(run.prompt.source)  # the workers' count of the prompts
        self.run = None
        line = run.finish(end_s)
        if self.ending is not None:
            self.ending.report(line)

    def on_quitting(self, environment: Environment, **_: Any) -> None:
        if self.exporter is not None:
            self.exporter.close()
