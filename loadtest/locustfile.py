"""The one locustfile of `locust -f loadtest/`: one user class and one shape.

    locust -f loadtest/                       web UI (shape mode: press Start)
    locust -f loadtest/ --headless            the stepped run, then the table and report.html
    locust -f loadtest/ --headless --processes 4
    locust -f loadtest/ --settings my.json    (or ZEROGAP_SETTINGS=my.json)
    locust -f loadtest/ --headless --progress-seconds 10 --print-stats   (Locust's own table every 2 s too)

Locust loads every .py file of this folder not named `_*`: this one alone. The harness lives in
loadgen/ (the live run) and loadreport/ (the report), beside this folder (loadtest/__init__.py).
"""

from __future__ import annotations

from typing import Any

from locust import LoadTestShape, User, constant, events, task
from locust.env import Environment

from loadgen.client import StreamClient
from loadgen.harness import Harness, UserSession
from loadgen.locust_options import add_options

HARNESS = Harness()


@events.init_command_line_parser.add_listener
def _add_options(parser: Any, **_: Any) -> None:
    add_options(parser)


@events.init.add_listener
def _on_init(environment: Environment, **kwargs: Any) -> None:
    HARNESS.on_init(environment, **kwargs)
    if HARNESS.settings is not None and not environment.host:
        LlmUser.host = HARNESS.base_url


class LlmUser(User):
    """Streams one completion after another (closed loop), or one per planned arrival (open loop)."""

    wait_time = constant(0)

    def on_start(self) -> None:
        self.stream_client: StreamClient = HARNESS.new_client()
        self.session: UserSession | None = HARNESS.new_session()
        HARNESS.wait_turn()  # Locust starts floor(spawn_rate) users at once: they start one by one

    def on_stop(self) -> None:
        self.stream_client.close()

    @task
    def complete(self) -> None:
        HARNESS.run_one(self.stream_client, self.session)


class SteppedShape(LoadTestShape):
    """Warm-up at the first step, then each step of settings.json's load_test.steps. The web UI's
    users and ramp-up fields show the first step's (use_common_options: shown, not hidden at 0)."""

    use_common_options = True

    def tick(self) -> tuple[int, float] | None:
        return HARNESS.tick(self.get_run_time())
