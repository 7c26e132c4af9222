"""The harness's figures in Locust's own stats (web UI, CSV, --print-stats): each request
as POST (response time = E2E, length = output tokens, failures by kind), plus TTFT and
TPOT rows. Locust rounds them to whole ms under 100 ms; the harness's report does not."""

from __future__ import annotations

from locust.env import Environment

from loadtest._record import RequestRecord


def fire_locust_events(env: Environment, path: str, record: RequestRecord, detail: str) -> None:
    fire = env.events.request.fire
    exception = None if record.ok else Exception(detail or record.error_kind)
    fire(
        request_type="POST",
        name=path,
        response_time=record.e2e_s * 1000,
        response_length=record.output_tokens,
        exception=exception,
        context={},
    )
    if record.ok and record.ttft_s is not None:
        fire(request_type="TTFT", name="time to first token", response_time=record.ttft_s * 1000,
             response_length=0, exception=None, context={})  # fmt: skip
    tpot = record.tpot_s
    if record.ok and tpot is not None:
        fire(request_type="TPOT", name="time per output token", response_time=tpot * 1000,
             response_length=0, exception=None, context={})  # fmt: skip
