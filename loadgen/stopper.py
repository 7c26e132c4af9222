"""Stopping a run for a reason the user must fix: the first requests all failed alike
(fail fast, loadgen/failfast.py), the base URL ends in /v1, or no model can be chosen.
The message goes to stderr with the fix when the run ends (no table after it); the run
still writes its folder and exits with status 1."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

import gevent
from locust.env import Environment

from loadgen.failfast import FIRST_N, FailFast, advice
from loadgen.models import ModelChoiceError, choose_model, list_models
from loadreport.record import RequestRecord


@dataclass
class Stopper:
    base_url: str
    headers: dict[str, str]
    timeout_s: float
    model: str = ""
    fail_fast: FailFast = field(default_factory=FailFast)
    stopping: bool = False
    reason: str = ""

    def choose_model(self, env: Environment, configured: str) -> str | None:
        """workload.model, else the only one /v1/models lists; None (the run stops) when none can be chosen."""
        try:
            self.model = configured or choose_model(self.base_url, self.headers, self.timeout_s)
        except ModelChoiceError as exc:
            fix = f"\nFix: {advice(exc.kind, self.base_url, '', None)}" if exc.kind else ""
            self.stop(env, f"{exc}{fix}")
            return None
        return self.model

    def observe(self, env: Environment, record: RequestRecord, detail: str) -> None:
        verdict = self.fail_fast.observe(record, detail)
        if verdict is None:
            return
        kind, message = verdict
        models = None
        if kind == "HTTP 404":
            try:
                models = list_models(self.base_url, self.headers, self.timeout_s)
            except ModelChoiceError:
                models = None
        fix = advice(kind, self.base_url, self.model, models)
        said = f": {message}" if message and message != kind else ""
        self.stop(env, f"the first {FIRST_N} requests all failed with {kind}{said}\nFix: {fix}")

    def stop(self, env: Environment, message: str) -> None:
        """Headless (or --autoquit): Locust quits, exit status 1; web UI: the test stops, the UI stays.
        The run's end (Run.finish) prints the message, in place of the table."""
        if self.stopping:
            return
        self.stopping, self.reason = True, message
        if env.runner is None:
            sys.stderr.write(f"zerogap loadtest: {message}\n")
            sys.stderr.flush()
            return
        env.process_exit_code = 1
        options = env.parsed_options
        headless = bool(getattr(options, "headless", False) or getattr(options, "autoquit", -1) >= 0)
        gevent.spawn(env.runner.quit if headless else env.runner.stop)
