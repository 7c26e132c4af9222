"""Verdicts that hold for the run (issue 42): a run that measured no step says it stopped early and
what it cannot tell (no empty table, no empty plot, no knee); a one-step run never says TPS "grows
per step"; a stepped run says "none up to" its top step only when TPS grew 10% from each step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loadreport.console import table
from loadreport.report import read_report, render_run
from loadreport.report_cli import main as report_main
from loadreport.verdict import knee_sentence
from tests.fixtures.upstream import Behavior, UpstreamServer
from tests.loadtest.helpers import run_locust, write_settings
from tests.loadtest.report_files import Figures, write_report

REASON = "the first 20 requests all failed with HTTP 401: bad key\nFix: the key was refused."
NO_STEP = "No step was measured: the run stopped early (the first 20 requests all failed with HTTP 401: bad key)"


def _everything_said(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> tuple[str, str, str]:
    """The console table, report.html, and what `zerogap report RUN_DIR` prints."""
    console = table(read_report(run_dir)[0])
    page = render_run(run_dir).read_text(encoding="utf-8")
    capsys.readouterr()
    assert report_main([str(run_dir)]) == 0
    return console, page, capsys.readouterr().out


def test_a_run_with_no_measured_step_says_it_stopped_early(tmp_path: Path, capsys) -> None:
    run = write_report(tmp_path / "refused", [], stopped_early=REASON)
    console, page, printed = _everything_said(run, capsys)
    for said in (console, page, printed):
        assert NO_STEP in said, said
        assert "It cannot tell TPS, latency, GPU utilization or where TPS stops growing" in said
        assert "grows" not in said and "Knee" not in said and "knee" not in said, said
    assert "out tok/s" not in console and "out tok/s" not in printed  # no empty table
    assert "vs_load.png" not in page and "<table class=steps" not in page  # no empty plot or table
    assert printed.rstrip().endswith(f"zerogap report: {run / 'report.html'}")


def test_one_step_says_what_it_can_tell_and_no_growth(tmp_path: Path, capsys) -> None:
    run = write_report(tmp_path / "one", [Figures(32, 3205.0, 95.0, 68.4, 9.7)])
    console, page, printed = _everything_said(run, capsys)
    for said in (console, page, printed):
        assert "grows" not in said and "grew" not in said, said
        assert "One step was measured with tokens (32 users): it tells TPS and latency at that load" in said
        assert "not known: a knee compares two steps or more, and 1 measured step served tokens." in said


def test_stepped_runs_say_growth_only_when_tps_grew(tmp_path: Path) -> None:
    growing = write_report(tmp_path / "growing", [Figures(32, 1000.0, 60, 50, 10), Figures(128, 2000.0, 90, 80, 20)])
    assert knee_sentence(read_report(growing)[0]) == (
        "Knee: none up to 128 users: TPS grew 10% or more from each of the 2 steps to the next; "
        "a higher step would show where it stops."
    )
    flat = write_report(tmp_path / "flat", [Figures(32, 1000.0, 60, 50, 10), Figures(128, 1050.0, 90, 40, 9)])
    sentence = knee_sentence(read_report(flat)[0])
    assert sentence.startswith("Knee: none found up to 128 users: TPS grew 5.0% from 32 users to 128 users")
    assert "10% or more" not in sentence


def test_a_refused_run_reads_the_same_through_zerogap_report(tmp_path: Path, capsys) -> None:
    """A real run whose every request is refused (fail fast, before its first window): report.json
    has no step; `zerogap report` says it stopped early and why, not an empty table and a knee."""
    with UpstreamServer(Behavior(fail_status=401, num_failures=None)) as up:
        settings = write_settings(tmp_path / "s.json", up.url, tmp_path / "runs", "refused")
        result = run_locust(settings, timeout_s=60)
    assert result.returncode == 1, result.stderr[-3000:]
    run = tmp_path / "runs" / "refused"
    assert read_report(run)[0]["steps"] == []
    capsys.readouterr()
    assert report_main([str(run)]) == 0
    printed = capsys.readouterr().out
    assert "No step was measured: the run stopped early (the first 20 requests all failed with HTTP 401" in printed
    assert "knee" not in printed.lower() and "out tok/s" not in printed, printed


def test_an_itl_p50_far_below_tpot_is_explained_where_it_is_shown(tmp_path: Path, capsys) -> None:
    run = write_report(tmp_path / "bunched", [Figures(32, 1000.0, 60, 50, 9.5), Figures(128, 2000.0, 90, 80, 22.0)])
    report = json.loads((run / "report.json").read_text(encoding="utf-8"))
    report["steps"][1]["itl_ms"] = {"p50": 0.0, "p90": 25.5, "p99": 40.0, "mean": 9.5}
    (run / "report.json").write_text(json.dumps(report), encoding="utf-8")
    console, page, printed = _everything_said(run, capsys)
    said = "ITL p50 0.0 ms at 128 users (TPOT p50 22.0 ms): ITL is the gap between two content events"
    for text in (console, page, printed):
        assert said in text and "count as 0.0 ms gaps" in text, text
        assert "ITL p50 9.5 ms at 32 users" not in text  # where ITL agrees with TPOT, nothing to explain
    even = write_report(tmp_path / "even", [Figures(32, 1000.0, 60, 50, 9.5)])
    assert "ITL p50" not in table(read_report(even)[0]).split("\n", 2)[2]  # below the header and the row
