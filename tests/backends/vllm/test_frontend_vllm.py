"""The `frontend` limit on real vLLM (the tiny local model on 2 CPU cores), both sides, one replica:

- 32 users asking for 4 tokens each: the API server's work per request (HTTP, chat template,
  tokenizer, streaming) outweighs the engine's 4 steps, so most requests are in the API server
  and few in the engine's step loop (measured: 20% of them, no queue) -> frontend;
- the same 32 users asking for 256 tokens: the engine's steps outweigh it, and the engine holds
  most of the users' requests (measured: 83-87%) -> not frontend.

The harness sends to the replica itself (no gateway), and reads its /metrics."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from backends.process_group import stop_process
from tests.backends.vllm.pool import MODEL, READY_TIMEOUT_S, Pool, ports_of, vllm_interpreter, write_config
from tests.loadtest.helpers import read_report, run_locust, write_settings
from tests.support import zerogap_cmd

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(900)]

USERS = 32


@pytest.fixture(scope="module")
def replica(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    """One vLLM replica started by `zerogap backends up`, no gateway in front."""
    folder = tmp_path_factory.mktemp("vllm-frontend")
    config = write_config(folder, vllm_interpreter())
    engine_port, gateway_port = ports_of(config)
    log = (folder / "backends.log").open("w")
    cmd = zerogap_cmd("backends", "up", "--engine", "vllm", "--config", str(config))
    backends = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=folder)
    pool = Pool(folder, config, backends, None, engine_port, gateway_port, log)
    try:
        pool.wait_output("zerogap backends: ready:", READY_TIMEOUT_S)
        yield pool
    finally:
        stop_process(backends, timeout_s=60)
        log.close()


def run(pool: Pool, tmp_path: Path, name: str, output_tokens: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """One 14-s step of USERS users through the real harness; (the step, its diagnosis)."""
    url = pool.engine_url
    settings = write_settings(
        tmp_path / f"{name}.json", url, tmp_path / "runs", name,
        api={"endpoint": "chat"},
        load_test={"steps": [USERS], "warmup_seconds": 3, "step_duration_seconds": 14, "measure_last_seconds": 12},
        workload={"model": MODEL, "input_tokens": 16, "max_output_tokens": output_tokens, "ignore_eos": True},
        metrics={"backend_metrics_urls": [f"{url}/metrics"], "sample_interval_ms": 500, "gpu_util": {"source": "none"}},
    )  # fmt: skip
    result = run_locust(settings, timeout_s=300)
    assert result.returncode == 0, result.stderr[-3000:]
    report = read_report(tmp_path / "runs" / name)
    (step,) = report["steps"]
    (entry,) = report["diagnosis"]
    engine = step["backend"]
    at_engine = (engine["running_mean"] + engine["waiting_mean"]) / USERS
    print(f"{name}: {at_engine:.0%} of {USERS} users' requests at the engine, {engine}; {entry['limit']}")
    assert step["valid"] and step["requests_failed"] == 0, step
    return step, entry


def test_short_answers_are_held_by_the_api_server_long_ones_by_the_engine(replica: Pool, tmp_path: Path) -> None:
    short, held = run(replica, tmp_path, "short", output_tokens=4)
    assert held["limit"] == "frontend", held
    assert "in the engines' own API servers" in held["evidence"] and "api_server_count" in held["advice"]
    engine = short["backend"]
    assert (engine["running_mean"] + engine["waiting_mean"]) / USERS < 0.4 and engine["waiting_mean"] < 1.0, engine

    long, passed = run(replica, tmp_path, "long", output_tokens=256)
    assert passed["limit"] != "frontend", passed
    engine = long["backend"]
    assert (engine["running_mean"] + engine["waiting_mean"]) / USERS >= 0.7, engine
