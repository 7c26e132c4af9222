"""A wrong key through a zerogap gateway: the gateway answers 401 until its failed-auth throttle
(20 per 10 s per address, as many as the fail-fast's first 20) answers 429 too_many_auth_failures.
That 429 is the same mistake: the run still stops with the key's advice, and it is not retried."""

from __future__ import annotations

from loadgen.failfast import FIRST_N, FailFast, advice
from loadgen.retry import retryable, with_retries
from loadreport.record import RequestRecord

THROTTLED = (
    "Too many failed authentications from your address (20 within 10 s, [gateway].auth_failures_limit). "
    "Check the key you send, and retry after 9 s."
)
RATE_LIMITED = "Rate limit reached for requests (rpm 60). Retry after 1 s."


def failed(kind: str) -> RequestRecord:
    return RequestRecord(100.0, 100.01, False, kind, None, 0.01, 0, 0, "chunks", None)


def test_401s_then_the_throttles_429_stop_the_run_as_a_wrong_key() -> None:
    watch = FailFast()
    for _ in range(FIRST_N - 2):  # the /tokenize call took one of the gateway's 20
        assert watch.observe(failed("HTTP 401"), "HTTP 401: Invalid API key.") is None
    assert watch.observe(failed("HTTP 429"), f"HTTP 429: {THROTTLED}") is None
    decided = watch.observe(failed("HTTP 429"), f"HTTP 429: {THROTTLED}")
    assert decided == ("HTTP 401", THROTTLED), decided  # the gateway's own words, without "HTTP 429: "
    assert "echo $TAOTOKEN_API_KEY" in advice(decided[0], "http://x/api", "m", None)


def test_a_rate_limit_429_is_not_a_key_refusal() -> None:
    watch = FailFast()
    decisions = [watch.observe(failed("HTTP 429"), f"HTTP 429: {RATE_LIMITED}") for _ in range(FIRST_N)]
    assert decisions[-1] == ("HTTP 429", RATE_LIMITED)
    mixed = FailFast()
    for _ in range(FIRST_N - 1):
        mixed.observe(failed("HTTP 401"), "HTTP 401: Invalid API key.")
    assert mixed.observe(failed("HTTP 429"), f"HTTP 429: {RATE_LIMITED}") is None  # two mistakes: no verdict


def test_the_throttles_429_is_not_retried_a_rate_limit_is() -> None:
    assert not retryable(failed("HTTP 429"), [], f"HTTP 429: {THROTTLED}")
    assert retryable(failed("HTTP 429"), [], f"HTTP 429: {RATE_LIMITED}")
    sent: list[int] = []

    def attempt() -> tuple[RequestRecord, list[float], str]:
        sent.append(1)
        return failed("HTTP 429"), [], f"HTTP 429: {THROTTLED}"

    done, _, _ = with_retries(attempt, 3)
    assert len(sent) == 1 and done.retries == 0
