"""The one locustfile of `locust -f loadtest/`: one user class and one shape.

    locust -f loadtest/                       web UI (shape mode: press Start)
    locust -f loadtest/ --headless            the stepped run, then the table and report.html
    locust -f loadtest/ --headless --processes 4
    locust -f loadtest/ --settings my.json    (or ZEROGAP_SETTINGS=my.json)

Everything else lives in modules whose names start with `_`, which Locust does not load.
"""

from __future__ import annotations

from typing import Any

from locust import LoadTestShape, User, constant, events, task
from locust.env import Environment

from loadtest._client import StreamClient
from loadtest._harness import Harness
from loadtest._workload import Session

HARNESS = Harness()


@events.init_command_line_parser.add_listener
def _add_options(parser: Any, **_: Any) -> None:
    parser.add_argument(
        "--settings",
        type=str,
        default=None,
        help="zerogap: the load-test settings file (default: $ZEROGAP_SETTINGS, else ./settings.json)",
    )


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
        self.session: Session | None = HARNESS.new_session()

    def on_stop(self) -> None:
        self.stream_client.close()

    @task
    def complete(self) -> None:
        HARNESS.run_one(self.stream_client, self.session)


class SteppedShape(LoadTestShape):
    """Warm-up at the first step, then each step of settings.json's load_test.steps."""

    def tick(self) -> tuple[int, float] | None:
        if HARNESS.plan is None:
            return None
        return HARNESS.plan.tick(self.get_run_time())
