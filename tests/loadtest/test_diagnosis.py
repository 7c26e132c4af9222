"""The diagnosis on hand-made steps: each limit from the figures that name it."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from loadreport.diagnosis import diagnose_step, diagnose_steps
from loadreport.diagnosis_reading import as_step
from loadtest import diagnose, headline
from tests.loadtest.diagnosis_steps import limit, step


def test_batch_cap_known_or_inferred_and_kv_cache() -> None:
    capped = step(running=16.0, waiting=48.0, cap=16)
    assert limit(capped) == "batch_cap"
    assert "max_num_seqs" in diagnose_step(capped, None, None).advice
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
    assert thin.limit == "batch_cap" and "engines read by 2 scrape(s) only" in thin.evidence
    assert "metrics.sample_interval_ms" in thin.evidence
    for enough in (3, None):  # None: a report from before the count was kept
        full = diagnose_step(step(running=16.0, waiting=48.0, cap=16, num_samples=enough), None, None)
        assert "scrape(s) only" not in full.evidence


def test_token_interval_compute_and_none() -> None:
    sync = step(gpu=55.0)
    assert limit(sync) == "token_interval"
    assert "async_scheduling" in diagnose_step(sync, None, None).advice
    assert "GPU busy 55%" in diagnose_step(sync, None, None).evidence
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
    # 30 of 64 at the engines where the step before had all of its 32: held in between; the gateway's
    # own in-flight gauge says where (it passed on 32: it holds the rest); without it, the engines' servers
    held = step(running=30.0, waiting=0.0, gpu=40.0, gateway_inflight=32.0)
    assert limit(held, before=step(users=32, running=32.0)) == "gateway"
    assert limit(step(running=30.0, waiting=0.0, gpu=40.0), before=step(users=32, running=32.0)) == "frontend"
    assert limit(held, before=step(users=32, running=20.0)) == "none"
    assert limit(step(running=30.0, waiting=0.0, gpu=40.0)) == "none"  # a fixed share in transit: no limit
    before = step(users=32, running=32.0, gpu=90.0, tps=900.0)
    squeezed = step(gpu=90.0, ttft_p50=101.0, tpot_p50=24.0)
    assert limit(squeezed, before=before) == "prefill"
    assert limit(step(gpu=90.0, ttft_p50=99.0, tpot_p50=24.0), before=before) == "compute"
    assert limit(step(gpu=90.0, ttft_p50=101.0, tpot_p50=25.0), before=before) == "compute"


def test_requests_waiting_in_an_engine_are_at_the_engines() -> None:
    """The share at the engines counts their queue with their batch: a request waiting in an engine
    is not held in front of it (the frontend, gateway and load-generator rules read this share).
    The queues here are under 10% of the users, so no queue rule speaks first."""
    # 30 of 64 at the engines (47%, 24 running and 6 waiting), no step before: a fixed share in transit
    assert limit(step(running=24.0, waiting=6.0, gpu=40.0)) == "none"
    assert limit(step(running=18.0, waiting=6.0, gpu=40.0)) == "frontend"  # 24 of 64 (38%): held in front
    # 40 of 64 (62%) against 26 of 32 (81%) at the step before: fell by less than 20 points
    before = step(users=32, running=24.0, waiting=2.0)
    assert limit(step(running=34.0, waiting=6.0, gpu=40.0), before=before) == "none"
    assert limit(step(running=34.0, waiting=6.0, gpu=40.0, gateway_inflight=40.0), before=before) == "none"


def test_diagnose_every_step_and_the_headline() -> None:
    loads = ((32, 1000, 50), (128, 3000, 55), (256, 3100, 56))
    steps = [step(users=n, running=float(n), tps=tps, gpu=gpu) for n, tps, gpu in loads]
    for index, one in enumerate(steps):
        one.index = index
    assert [e.limit for e in diagnose_steps(steps)] == ["none", "token_interval", "token_interval"]
    entries = diagnose([one.model_dump() for one in steps])  # report.json's steps, as read from the file
    assert [e["limit"] for e in entries] == ["none", "token_interval", "token_interval"]
    assert [e["step"] for e in entries] == [0, 1, 2] and [e["concurrency"] for e in entries] == [32, 128, 256]
    sentence = headline(entries)
    assert sentence.startswith("At the top step (256 users) TPS is limited by token_interval")
    assert "async_scheduling" in sentence


def test_a_step_read_from_an_older_report_or_a_virtual_run_is_typed_with_what_it_has() -> None:
    """Figures the step lacks are "not measured"; the ones it has are checked as the schema says."""
    partial = {"index": 2, "concurrency": 64, "users": 64, "output_tps": 900.0, "ttft_ms": {"p50": 40.0}}
    partial["backend"] = {"running_mean": 16.0, "running_max": 16.0, "waiting_mean": 48.0, "max_num_seqs": 16}
    (entry,) = diagnose([partial])
    assert entry["limit"] == "batch_cap" and entry["step"] == 2, entry
    assert "running 16.0 of a cap of 16, waiting 48.0" in entry["evidence"]
    # a figure of the wrong type (a zerogap bug): the run's report is still written, the entry says why
    (unread,) = diagnose([{**partial, "backend": {"running_mean": "sixteen"}}])
    assert unread["step"] == 2 and unread["limit"] == "none", unread
    assert "not diagnosed" in unread["evidence"] and "backend.running_mean" in unread["evidence"]
    with pytest.raises(ValidationError, match=r"backend\.running_mean"):
        as_step({**partial, "backend": {"running_mean": "sixteen"}})
