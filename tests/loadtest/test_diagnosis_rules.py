"""Each threshold of the diagnosis at its edge (just below it, and at it) and the order of its
rules: a rule moved, or a threshold changed, names another limit for one of these steps.
Every pair is made of figures a plain float holds exactly at the threshold."""

from __future__ import annotations

from loadreport.diagnosis import diagnose_steps
from loadtest import diagnose, headline
from tests.loadtest.diagnosis_steps import limit, step


def test_a_queue_with_room_in_the_batch_reads_the_kv_cache_from_90_percent() -> None:
    """52 of 64 wait, 12 run under a cap of 256: the KV cache holds them from 90% full, else prefill."""
    for kv, expected in ((0.6, "prefill"), (0.89, "prefill"), (0.9, "kv_cache"), (0.97, "kv_cache")):
        assert limit(step(running=12.0, waiting=52.0, cap=256, kv=kv, gpu=40.0)) == expected, kv


def test_tps_that_still_grows_comes_before_every_engine_limit() -> None:
    """10% more TPS at the next step: more load pays, whatever holds the step (9.9%: the limit)."""
    held = {
        "batch_cap": step(running=16.0, waiting=48.0, cap=16, tps=1000.0),
        "kv_cache": step(running=64.0, waiting=0.0, preemptions=3, tps=1000.0),
        "frontend": step(running=10.0, waiting=0.0, gpu=40.0, tps=1000.0),
        "gateway": step(running=10.0, waiting=0.0, gpu=40.0, gateway_inflight=12.0, tps=1000.0),
        "prefill": step(running=12.0, waiting=52.0, cap=256, kv=0.3, gpu=40.0, tps=1000.0),
        "compute": step(gpu=95.0, tps=1000.0),
    }
    for name, here in held.items():
        assert limit(here, after=step(users=128, tps=1099.0)) == name
        assert limit(here, after=step(users=128, tps=1100.0)) == "none", name


def test_a_queue_is_10_percent_of_the_users_and_at_least_one_request() -> None:
    # 64 users: 6.4 waiting is a queue (a full batch at its cap), 6.3 is arrivals between two steps
    assert limit(step(running=16.0, waiting=6.4, cap=16, gpu=40.0)) == "batch_cap"
    assert limit(step(running=16.0, waiting=6.3, cap=16, gpu=40.0)) != "batch_cap"
    # 5 users: one request waiting is a queue, 0.99 is none
    assert limit(step(users=5, running=2.0, waiting=1.0, cap=2, gpu=40.0)) == "batch_cap"
    assert limit(step(users=5, running=2.0, waiting=0.99, cap=2, gpu=40.0)) != "batch_cap"


def test_the_batch_is_at_its_cap_from_90_percent_of_it() -> None:
    assert limit(step(running=14.4, waiting=48.0, cap=16, running_max=15.0, gpu=40.0)) == "batch_cap"
    assert limit(step(running=14.3, waiting=48.0, cap=16, running_max=15.0, gpu=40.0)) == "prefill"
    assert limit(step(running=14.3, waiting=48.0, cap=16, running_max=16.0, gpu=40.0)) == "batch_cap"  # peak


def test_errors_from_2_percent_of_the_requests() -> None:
    assert limit(step(requests_ok=98, requests_failed=2, errors={"http_500": 2})) == "errors"
    assert limit(step(requests_ok=99, requests_failed=2, errors={"http_500": 2})) != "errors"  # 1.98%


def test_requests_held_in_front_from_under_70_percent_at_the_engines_20_points_fewer() -> None:
    """100 users, the step before held 75 at the engines; a share that fell 20 points and is under 70%."""
    before = step(users=100, running=75.0, gpu=40.0)
    assert limit(step(users=100, running=55.0, gpu=40.0), before=before) == "frontend"  # fell 20 points
    assert limit(step(users=100, running=56.0, gpu=40.0), before=before) == "none"  # fell 19
    full = step(users=100, running=100.0, gpu=40.0)  # the step before held every request
    assert limit(step(users=100, running=69.9, gpu=40.0), before=full) == "frontend"
    assert limit(step(users=100, running=70.0, gpu=40.0), before=full) == "none"  # 70% in: HTTP and tokenizer


def test_under_40_percent_at_the_engines_is_held_in_front_without_a_step_before() -> None:
    """The 2-core real-vLLM case (running 0.8, waiting 0.4 of 8 users) and the edge at 40%."""
    assert limit(step(users=8, running=0.8, waiting=0.4, cap=2, gpu=None)) == "frontend"
    assert limit(step(users=100, running=39.9, gpu=40.0)) == "frontend"
    assert limit(step(users=100, running=40.0, gpu=40.0)) == "none"
    assert limit(step(users=100, running=39.9, gpu=None)) == "frontend"  # no GPU signal (vLLM on CPU)


def test_held_in_front_of_a_busy_engine_is_not_the_limit() -> None:
    """The engine not busy: its GPU under 85%, its batch under 90% of the cap, no queue."""
    assert limit(step(users=100, running=30.0, gpu=84.9)) == "frontend"
    assert limit(step(users=100, running=30.0, gpu=85.0)) == "compute"
    assert limit(step(users=100, running=14.3, cap=16, gpu=40.0)) == "frontend"
    assert limit(step(users=100, running=14.4, cap=16, gpu=40.0)) == "token_interval"  # the batch is full
    assert limit(step(users=100, running=30.0, waiting=10.0, cap=256, kv=0.3, gpu=40.0)) == "prefill"  # a queue


def test_the_gateways_own_gauge_tells_gateway_from_frontend() -> None:
    """64 users, 20 at the engines: the gateway passed on g. It holds 64 - g; the engines' servers g - 20.
    The larger part names the limit (equal: the engines' servers)."""
    assert limit(step(running=20.0, gpu=40.0, gateway_inflight=41.9)) == "gateway"
    assert limit(step(running=20.0, gpu=40.0, gateway_inflight=42.0)) == "frontend"
    assert limit(step(running=20.0, gpu=40.0, gateway_inflight=64.0)) == "frontend"
    held = diagnose_steps([step(running=20.0, gpu=40.0, gateway_inflight=30.0)])[0]
    assert "the gateway has passed on only 30.0 of 64" in held.evidence and "--workers" in held.advice
    front = diagnose_steps([step(running=20.0, gpu=40.0)])[0]
    assert "in the engines' own API servers (no gateway in-flight figure" in front.evidence
    assert "api_server_count" in front.advice and "--api-server-count" in front.advice
    assert "detokenizer_async" in front.advice and "replicas" in front.advice and "--stream-interval" in front.advice


def test_the_batch_is_full_for_token_interval_from_90_percent_of_the_users() -> None:
    assert limit(step(running=57.6, gpu=55.0)) == "token_interval"
    assert limit(step(running=57.5, gpu=55.0)) == "none"


def test_prefill_from_ttft_doubled_while_tpot_grows_under_25_percent() -> None:
    before = step(users=32, running=32.0, gpu=90.0, ttft_p50=50.0, tpot_p50=20.0)
    assert limit(step(gpu=90.0, ttft_p50=100.0, tpot_p50=24.9), before=before) == "prefill"
    assert limit(step(gpu=90.0, ttft_p50=99.9, tpot_p50=24.9), before=before) == "compute"
    assert limit(step(gpu=90.0, ttft_p50=100.0, tpot_p50=25.0), before=before) == "compute"


def test_a_request_rate_step_is_named_by_its_rate() -> None:
    """Open loop: the entry carries the rate and the headline says req/s, never users."""
    steps = [step(users=40, request_rate=5.0, running=40.0, gpu=55.0)]
    (entry,) = diagnose([one.model_dump() for one in steps])
    assert entry["request_rate"] == 5.0 and entry["concurrency"] == 40
    sentence = headline([entry])
    assert sentence.startswith("At the top step (5 req/s) TPS is limited by token_interval"), sentence
    assert "users" not in sentence.split(":")[0]
    closed = diagnose([step(users=40, running=40.0, gpu=55.0)])
    assert "request_rate" not in closed[0] and headline(closed).startswith("At the top step (40 users)")
