"""api.max_retries: which failures are retried, how often, and that latency counts from the first attempt."""

from __future__ import annotations

from pathlib import Path

from loadgen.retry import with_retries
from loadreport.record import RequestRecord
from tests.fixtures.upstream import Behavior, UpstreamServer
from tests.loadtest.helpers import read_report, run_locust, write_settings


def record(start: float, kind: str = "", ttft_s: float | None = 0.1, e2e_s: float = 0.5) -> RequestRecord:
    return RequestRecord(start, start + e2e_s, not kind, kind, ttft_s, e2e_s, 20, 10, "usage", None)


def attempts(*records: RequestRecord):
    queue = list(records)
    sent: list[RequestRecord] = []

    def attempt() -> tuple[RequestRecord, list[float], str]:
        sent.append(queue.pop(0))
        return sent[-1], ([] if sent[-1].error_kind else [sent[-1].start + 0.1]), sent[-1].error_kind

    return attempt, sent


def test_failed_before_the_first_byte_is_retried_and_timed_from_the_first_attempt() -> None:
    attempt, sent = attempts(record(100.0, "HTTP 503", None, 0.01), record(100.3, "connection error", None, 0.0),
                             record(101.0))  # fmt: skip
    done, _, _ = with_retries(attempt, 3)
    assert len(sent) == 3 and done.ok and done.retries == 2
    assert done.start == 100.0 and done.ttft_s is not None and done.tpot_s is not None
    assert abs(done.ttft_s - 1.1) < 1e-9 and abs(done.e2e_s - 1.5) < 1e-9  # 1 s lost to the failed attempts
    assert abs(done.tpot_s - 0.4 / 19) < 1e-9  # the token timing itself is untouched


def test_at_most_max_retries_and_only_retryable_kinds() -> None:
    attempt, sent = attempts(*(record(100.0 + i, "HTTP 429", None, 0.0) for i in range(5)))
    done, _, _ = with_retries(attempt, 2)
    assert len(sent) == 3 and not done.ok and done.retries == 2
    for kind in ("HTTP 401", "HTTP 404", "timeout", "broken stream"):
        attempt, sent = attempts(record(100.0, kind, None), record(101.0))
        done, _, _ = with_retries(attempt, 3)
        assert len(sent) == 1 and done.error_kind == kind and done.retries == 0


def test_a_run_counts_its_retries_per_step(tmp_path: Path) -> None:
    """The upstream refuses its first 6 requests with 503: with api.max_retries 3 none fails,
    and the steps' `retries` add up to the 6 refusals."""
    behavior = Behavior(ttft_s=0.05, interval_s=0.01, num_output_tokens=10, fail_status=503, num_failures=6)
    with UpstreamServer(behavior) as up:
        load = {"steps": [2], "warmup_seconds": 0, "measure_last_seconds": 4}
        settings = write_settings(tmp_path / "s.json", up.url, tmp_path / "runs", "retries",
                                  api={"max_retries": 3}, load_test=load)  # fmt: skip
        done = run_locust(settings)
    assert done.returncode == 0, done.stderr[-3000:]
    (step,) = read_report(tmp_path / "runs" / "retries")["steps"]
    assert step["requests_failed"] == 0 and step["retries"] == 6 and step["requests_ok"] > 0
