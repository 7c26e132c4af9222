"""Fail fast, as the user reads it: a base URL ending in /v1 is named with the URL to set
instead, and a run stopped for a reason prints that reason, not an empty table and a knee."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.fixtures.upstream import Behavior, UpstreamServer
from tests.loadtest.helpers import run_locust, write_settings
from zerogap import locust_run


def test_a_base_url_ending_in_v1_says_what_to_set(tmp_path: Path) -> None:
    with UpstreamServer(Behavior()) as up:
        doubled = f"{up.url}/api/v1"
        settings = write_settings(tmp_path / "s.json", doubled, tmp_path / "runs", "doubled", workload={"model": ""})
        from_file = run_locust(settings, timeout_s=60)
        from_host = run_locust(settings, "-H", f"{up.url}/v1/", timeout_s=60)
        num_requests = len(up.requests)
    assert from_file.returncode == 2, from_file.stderr[-3000:]
    assert f"api.base_url {doubled} ends in /v1" in from_file.stderr, from_file.stderr[-3000:]
    assert f"{doubled}/v1/chat/completions" in from_file.stderr
    assert f"Set api.base_url to {up.url}/api\n" in from_file.stderr
    assert "none could be listed" not in from_file.stderr and "Traceback" not in from_file.stderr
    assert from_host.returncode == 2, from_host.stderr[-3000:]
    assert f"Set the host (Locust's -H / the web UI's Host) to {up.url}\n" in from_host.stderr, from_host.stderr
    assert num_requests == 0  # said before a request is sent
    assert not (tmp_path / "runs").exists()


def test_a_fail_fast_stop_prints_the_reason_and_no_table(tmp_path: Path) -> None:
    behavior = Behavior(fail_status=404, num_failures=None)
    with UpstreamServer(behavior) as up:
        settings = write_settings(tmp_path / "s.json", up.url, tmp_path / "runs", "lost")
        result = run_locust(settings, "--progress-seconds", "0.5", timeout_s=60)
    assert result.returncode == 1, result.stderr[-3000:]
    assert "zerogap loadtest: the first 20 requests all failed with HTTP 404: " in result.stderr, result.stderr[-3000:]
    assert "Fix: the model 'test-model' or the path was not found" in result.stderr
    assert result.stderr.count("the first 20 requests all failed") == 1  # said once, at the end
    assert "the run stopped early; its folder: " in result.stderr
    assert "knee:" not in result.stdout and "out tok/s" not in result.stdout, result.stdout
    assert "zerogap step" not in result.stdout and "zerogap report:" not in result.stdout, result.stdout
    assert (tmp_path / "runs" / "lost" / "report.json").is_file()  # the run folder is still written


def test_demo_and_tune_show_why_their_run_stopped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """zerogap.locust_run (the child run of `zerogap demo` / `zerogap tune`) relays the reason and the fix."""
    with UpstreamServer(Behavior(fail_status=401, num_failures=None)) as up:
        settings = write_settings(tmp_path / "s.json", up.url, tmp_path / "runs", "refused")
        returncode = locust_run.run_locust(settings, dict(os.environ), tmp_path / "locust.log")
    console = capsys.readouterr().out
    assert returncode == 1
    assert "  zerogap loadtest: the first 20 requests all failed with HTTP 401" in console, console
    assert "  Fix: the key was refused." in console and "zerogap progress" not in console
