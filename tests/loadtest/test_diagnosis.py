"""The diagnosis on hand-made steps: each limit from the figures that name it."""

from __future__ import annotations

from typing import Any

from loadtest._diagnosis import LIMITS, diagnose, diagnose_step, headline


def step(
    users: int = 64,
    tps: float = 1000.0,
    running: float | None = 64.0,
    waiting: float | None = 0.0,
    gpu: float | None = 60.0,
    **extra: Any,
) -> dict[str, Any]:
    backend = {
        "running_mean": running,
        "running_max": running,
        "waiting_mean": waiting,
        "kv_cache_usage_mean": extra.pop("kv", 0.2),
        "preemptions": extra.pop("preemptions", None),
        "max_num_seqs": extra.pop("cap", None),
        "num_samples": extra.pop("num_samples", None),
    }
    figures: dict[str, Any] = {
        "index": 0,
        "concurrency": users,
        "users": users,
        "output_tps": tps,
        "requests_ok": 100,
        "requests_failed": 0,
        "errors": {},
        "valid": True,
        "invalid_reason": None,
        "gpu_util": None if gpu is None else {"mean": gpu, "min": gpu - 5},
        "token_interval_ms": 4.0,
        "cpu_interval_ms": 5.0,
        "ttft_ms": {"p50": 50.0},
        "tpot_ms": {"p50": 20.0},
        "backend": backend,
    }
    figures.update(extra)
    return figures


def limit(one: dict[str, Any], before: dict[str, Any] | None = None, after: dict[str, Any] | None = None) -> str:
    entry = diagnose_step(one, before, after)
    assert entry["limit"] in LIMITS and entry["evidence"] and entry["advice"]
    return str(entry["limit"])


def test_batch_cap_known_or_inferred_and_kv_cache() -> None:
    capped = step(running=16.0, waiting=48.0, cap=16)
    assert limit(capped) == "batch_cap"
    assert "max_num_seqs" in diagnose_step(capped, None, None)["advice"]
    assert limit(step(running=16.0, waiting=48.0)) == "batch_cap"  # no cap known: the flat running count
    assert limit(step(running=12.0, waiting=52.0, cap=256, kv=None)) == "kv_cache"  # waiting below the cap
    assert limit(step(running=12.0, waiting=52.0, cap=256, kv=0.3, gpu=40.0)) == "prefill"  # KV has room
    assert limit(step(running=16.0, waiting=48.0, kv=0.97)) == "kv_cache"
    assert limit(step(running=64.0, waiting=0.0, gpu=95.0, preemptions=3)) == "kv_cache"
    assert limit(step(users=16, running=16.0, waiting=0.4, cap=16, gpu=95.0)) == "compute"  # no real queue
    # a few arrivals between two steps (under 10% of the users) are no queue
    assert limit(step(running=61.7, waiting=2.3, cap=128, kv=None, gpu=59.0)) == "token_interval"
    assert limit(step(running=57.0, waiting=6.5, cap=128, kv=None, gpu=59.0)) == "kv_cache"


def test_evidence_from_too_few_scrapes_says_so() -> None:
    """A window the sampler read once or twice (a short step, a slow /metrics) is thin evidence."""
    thin = diagnose_step(step(running=16.0, waiting=48.0, cap=16, num_samples=2), None, None)
    assert thin["limit"] == "batch_cap" and "engines read by 2 scrape(s) only" in thin["evidence"]
    assert "metrics.sample_interval_ms" in thin["evidence"]
    for enough in (3, None):  # None: a report from before the count was kept
        full = diagnose_step(step(running=16.0, waiting=48.0, cap=16, num_samples=enough), None, None)
        assert "scrape(s) only" not in full["evidence"]


def test_token_interval_compute_and_none() -> None:
    sync = step(gpu=55.0)
    assert limit(sync) == "token_interval"
    assert "async_scheduling" in diagnose_step(sync, None, None)["advice"]
    assert "GPU busy 55%" in diagnose_step(sync, None, None)["evidence"]
    assert limit(step(gpu=84.0)) == "token_interval"
    assert limit(step(gpu=85.0)) == "compute"
    assert limit(step(gpu=98.0)) == "compute"
    # TPS still grows 10% to the next step: none, whatever the GPU says.
    assert limit(step(gpu=55.0, tps=1000), after=step(users=128, tps=1100)) == "none"
    assert limit(step(gpu=55.0, tps=1000), after=step(users=128, tps=1099)) == "token_interval"
    assert limit(step(gpu=None, running=None, waiting=None)) == "none"


def test_errors_load_generator_gateway_prefill() -> None:
    assert limit(step(requests_failed=3, requests_ok=97, errors={"http_429": 3})) == "errors"
    assert limit(step(gpu=98.0, requests_failed=1, requests_ok=99)) == "compute"  # 1% is not the limit
    assert limit(step(valid=False, invalid_reason="load generator CPU 99% >= 90%")) == "load_generator"
    # 30 of 64 at the engines where the step before had all of its 32: held in between
    assert limit(step(running=30.0, waiting=0.0, gpu=40.0), before=step(users=32, running=32.0)) == "gateway"
    assert limit(step(running=30.0, waiting=0.0, gpu=40.0), before=step(users=32, running=20.0)) == "none"
    assert limit(step(running=30.0, waiting=0.0, gpu=40.0)) == "none"  # a fixed share in transit: no limit
    before = step(users=32, running=32.0, gpu=90.0, tps=900.0)
    squeezed = step(gpu=90.0, ttft_ms={"p50": 101.0}, tpot_ms={"p50": 24.0})
    assert limit(squeezed, before=before) == "prefill"
    assert limit(step(gpu=90.0, ttft_ms={"p50": 99.0}, tpot_ms={"p50": 24.0}), before=before) == "compute"
    assert limit(step(gpu=90.0, ttft_ms={"p50": 101.0}, tpot_ms={"p50": 25.0}), before=before) == "compute"


def test_diagnose_every_step_and_the_headline() -> None:
    loads = ((32, 1000, 50), (128, 3000, 55), (256, 3100, 56))
    steps = [step(users=n, running=float(n), tps=tps, gpu=gpu) for n, tps, gpu in loads]
    for index, one in enumerate(steps):
        one["index"] = index
    entries = diagnose(steps)
    assert [e["limit"] for e in entries] == ["none", "token_interval", "token_interval"]
    assert [e["step"] for e in entries] == [0, 1, 2] and [e["concurrency"] for e in entries] == [32, 128, 256]
    sentence = headline(entries)
    assert sentence.startswith("At the top step (256 users) TPS is limited by token_interval")
    assert "async_scheduling" in sentence
