"""Master <-> workers (`--processes N`, `--master`/`--worker`): each worker ships its records with
every stats report Locust sends; at the end the master asks every worker to stop and send the
rest, and waits for all of them (bounded)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import gevent
from locust.env import Environment
from locust.runners import MasterRunner, Runner, WorkerRunner

from loadgen.exporter import Exporter
from loadgen.run import Run

log = logging.getLogger("zerogap.loadtest")
WIRE_KEY = "zerogap"
FINAL_WAIT_S = 12.0
STOP_MESSAGE = "zerogap_stop"
FINAL_MESSAGE = "zerogap_final"


def wire(run: Run | None) -> dict[str, Any]:
    """What a worker has recorded since its last report (and how its prompt was counted)."""
    if run is None:
        return {}
    data = run.recorder.drain()
    data["prompt_source"] = run.prompt.source
    return data


class WorkerLink:
    def __init__(self, env: Environment, current: Callable[[], Run | None], exporter: Exporter | None) -> None:
        self.env = env
        self.current = current  # the run in progress, if any
        self.exporter = exporter
        self.finals: set[str] = set()  # the workers whose final report came

    def install(self, runner: Runner | None) -> None:
        self.env.events.report_to_master.add_listener(self.on_report_to_master)
        self.env.events.worker_report.add_listener(self.on_worker_report)
        if isinstance(runner, WorkerRunner):
            runner.register_message(STOP_MESSAGE, self.on_stop_message)
        elif isinstance(runner, MasterRunner):
            runner.register_message(FINAL_MESSAGE, self.on_final_message)

    # the worker's side

    def on_report_to_master(self, client_id: str, data: dict[str, Any], **_: Any) -> None:
        data[WIRE_KEY] = wire(self.current())

    def on_stop_message(self, environment: Environment, msg: Any, **_: Any) -> None:
        """The master is finishing the run: stop the users (letting them finish their streams for the
        seconds the master says, when the plan ended: loadgen/ending.py) and send the rest now."""
        runner = environment.runner
        assert isinstance(runner, WorkerRunner)
        run = self.current()  # stopping ends it here
        asked, drain_s = environment.stop_timeout, float((msg.data or {}).get("drain_s") or 0.0)
        if drain_s and not asked:
            environment.stop_timeout = drain_s
        try:
            runner.stop()
        finally:
            environment.stop_timeout = asked
        runner.send_message(FINAL_MESSAGE, {"client_id": runner.client_id, WIRE_KEY: wire(run)})

    # the master's side

    def on_worker_report(self, client_id: str, data: dict[str, Any], **_: Any) -> None:
        if data.get(WIRE_KEY):
            self.ingest(data[WIRE_KEY])

    def on_final_message(self, environment: Environment, msg: Any, **_: Any) -> None:
        data = msg.data or {}
        self.ingest(data.get(WIRE_KEY) or {})
        self.finals.add(str(data.get("client_id", msg.node_id)))

    def ingest(self, data: dict[str, Any]) -> None:
        run = self.current()
        if run is None or not data:
            return
        run.prompt.source = str(data.get("prompt_source", run.prompt.source))
        records = run.recorder.ingest(data)
        for record in records:  # the server's message for its kind of failure, as the worker saw it
            run.stopper.observe(self.env, record, run.recorder.error_details.get(record.error_kind, ""))
        if self.exporter is not None:
            for record in records:
                self.exporter.observe(record)
            for process, samples in (data.get("cpu") or {}).items():
                if samples:
                    self.exporter.cpu.labels(process).set(float(samples[-1][1]))

    def collect(self, runner: MasterRunner, drain_s: float = 0.0) -> int:
        """Ask every worker to stop (its users may finish their streams for drain_s) and send what it has;
        wait for all of them (bounded). The number of workers that took part."""
        expected = {client.id for client in runner.clients.all}
        self.finals = set()
        runner.send_message(STOP_MESSAGE, {"drain_s": drain_s})
        deadline = time.time() + FINAL_WAIT_S + drain_s
        while time.time() < deadline and not expected <= self.finals:
            gevent.sleep(0.05)
        missing = expected - self.finals
        if missing:
            log.warning("zerogap: %d worker(s) sent no final report; their last seconds may be missing", len(missing))
        return len(expected)
