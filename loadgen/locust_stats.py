"""The harness's requests in Locust's own stats (web UI, CSV, --print-stats): each request
as one POST (response time = E2E, length = output tokens, failures by kind). Nothing
else is fired as a request, so Locust's RPS and Aggregated row count requests only;
TTFT, TPOT, TPS and GPU utilization are in the web UI's zerogap tab (loadgen/webui.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from loadreport.record import RequestRecord

if TYPE_CHECKING:  # locust is imported (and gevent patches the process) by the locustfile, not by this module
    from locust.env import Environment


def request_name(path: str) -> str:
    """The OpenAI route the request went to, as loadtest/README.md names it: `/v1/chat/completions`
    whatever base path the server has (`/api/v1/chat/completions` is shown as `POST /v1/chat/completions`)."""
    found = path.find("/v1/")
    return path[found:] if found >= 0 else path


def fire_locust_events(env: Environment, path: str, record: RequestRecord, detail: str) -> None:
    exception = None if record.ok else Exception(detail or record.error_kind)
    env.events.request.fire(
        request_type="POST",
        name=request_name(path),
        response_time=record.e2e_s * 1000,
        response_length=record.output_tokens,
        exception=exception,
        context={},
    )
