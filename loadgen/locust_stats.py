"""The harness's requests in Locust's own stats (web UI, CSV, --print-stats): each request
as one POST (response time = E2E, length = output tokens, failures by kind). Nothing
else is fired as a request, so Locust's RPS and Aggregated row count requests only;
TTFT, TPOT, TPS and GPU utilization are in the web UI's zerogap tab (loadgen/webui.py)."""

from __future__ import annotations

from locust.env import Environment

from loadreport.record import RequestRecord


def fire_locust_events(env: Environment, path: str, record: RequestRecord, detail: str) -> None:
    exception = None if record.ok else Exception(detail or record.error_kind)
    env.events.request.fire(
        request_type="POST",
        name=path,
        response_time=record.e2e_s * 1000,
        response_length=record.output_tokens,
        exception=exception,
        context={},
    )
