"""How a headless run ends (issue 42): the users finish the streams they had when the plan ended,
so the engine aborts none of them (the gateway would count them as clients gone, status 499);
Locust's spawn-rate warning is not printed; the warm-up has a progress line; the report's line
is the last on screen; Locust names the request by its OpenAI route."""

from __future__ import annotations

import os
import subprocess
import urllib.request
from pathlib import Path

import pytest

from backends.sim.testing import run_sim_process
from common.promtext import sum_samples
from loadgen.locust_stats import request_name
from tests.loadtest.helpers import locust_cmd, read_report, run_locust, write_settings
from tests.support import REPO

ABORTED = ("vllm:request_success_total", {"finished_reason": "abort"})


def _aborted(url: str) -> float:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        return sum_samples(response.read(), ABORTED[0], ABORTED[1]) or 0.0


@pytest.mark.slow
def test_a_finished_run_lets_its_streams_end_and_says_where_its_report_is_last(tmp_path: Path) -> None:
    with run_sim_process("--time-scale", "1", model="ending") as sim:
        settings = write_settings(
            tmp_path / "s.json", sim.url, tmp_path / "runs", "ending",
            load_test={"steps": [4, 101], "warmup_seconds": 1, "step_duration_seconds": 3, "measure_last_seconds": 2},
            workload={"model": sim.model, "input_tokens": 16, "max_output_tokens": 60, "ignore_eos": True},
        )  # fmt: skip
        # one stream, as a terminal shows it: Locust's tables (stderr) and the harness's lines (stdout) in order
        result = subprocess.run(
            locust_cmd(settings),
            cwd=REPO,
            env=dict(os.environ),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=120,
            check=False,
        )
        aborted = _aborted(sim.url)
    said = result.stdout
    assert result.returncode == 0, said[-3000:]
    report = read_report(tmp_path / "runs" / "ending")
    # No stream was cut while the engine still served it (the gateway would count it as status 499).
    # A client starved of CPU may still be reading answers the engine has finished when its wait ends:
    # those count as interrupted in the report, and the engine saw them end (not judged here).
    assert aborted == 0, (aborted, said)
    assert "requests in flight may finish (at most " in result.stdout, said
    assert report["run"]["duration_s"] < 7.5  # the plan's time: the streams that finished after it are not in it
    assert "spawn rate is very high" not in said, said[-3000:]
    assert "zerogap progress: warm-up, 4 users, " in result.stdout, result.stdout
    assert result.stdout.rstrip().splitlines()[-1] == f"zerogap report: {tmp_path / 'runs' / 'ending' / 'report.html'}"


def test_locust_names_the_request_by_its_openai_route() -> None:
    assert request_name("/api/v1/chat/completions") == "/v1/chat/completions"
    assert request_name("/v1/completions") == "/v1/completions"
    assert request_name("/custom/generate") == "/custom/generate"  # not an OpenAI route: as sent


@pytest.mark.slow
def test_drain_seconds_zero_cuts_the_streams_at_the_end(tmp_path: Path) -> None:
    """load_test.drain_seconds 0 (as `zerogap tune` sets it: it stops the pool next): the streams
    in flight when the plan ends are cut at once; the engine sees them aborted and the report
    counts them as interrupted, not failed."""
    with run_sim_process("--time-scale", "1", model="cut") as sim:
        settings = write_settings(
            tmp_path / "s.json", sim.url, tmp_path / "runs", "cut",
            load_test={"steps": [8], "warmup_seconds": 1, "step_duration_seconds": 2, "measure_last_seconds": 1,
                       "drain_seconds": 0},
            workload={"model": sim.model, "input_tokens": 16, "max_output_tokens": 400, "ignore_eos": True},
        )  # fmt: skip
        result = run_locust(settings, timeout_s=120)
        aborted = _aborted(sim.url)
    said = result.stdout + result.stderr
    assert result.returncode == 0, said[-3000:]
    assert "may finish (at most" not in said, said[-3000:]
    report = read_report(tmp_path / "runs" / "cut")
    assert report["run"]["interrupted_requests"] >= 1, report["run"]
    assert aborted >= 1, said[-3000:]
