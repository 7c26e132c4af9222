"""`zerogap report` on the command line: one run prints its table and its page's path, two runs
print both tables and the ratios B/A step by step (report.json files with known figures)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from loadtest import StepFigures, ratio_line, ratio_lines, table
from tests.loadtest.report_files import Figures, write_report
from tests.support import REPO, zerogap_cmd


def _zerogap_report(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = zerogap_cmd("report", *args)
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=180, check=False)


def test_report_of_one_run_prints_its_table_and_where_the_page_is(tmp_path: Path) -> None:
    run = write_report(tmp_path / "run", [Figures(2, 1234.0, 50.0, 100.0, 20.0), Figures(4, 2000.0, 80.0, 120.0, 25.0)])
    done = _zerogap_report(str(run))
    assert done.returncode == 0, done.stderr
    expected = table(json.loads((run / "report.json").read_text(encoding="utf-8")))
    assert done.stdout == f"{expected}\nzerogap report: {run / 'report.html'}\n"
    assert "1,234" in done.stdout  # the table's figures, not only its header
    assert (run / "report.html").is_file() and (run / "vs_load.png").is_file()


def test_report_of_two_runs_prints_both_tables_and_the_ratios_per_load(tmp_path: Path) -> None:
    a = write_report(
        tmp_path / "a",
        [Figures(2, 100.0, 50.0, 100.0, 20.0), Figures(4, 200.0, 80.0, 120.0, 25.0), Figures(8, 210.0, 90, 400, 40)],
    )
    b = write_report(
        tmp_path / "b",
        [Figures(2, 150.0, 60.0, 80.0, 20.0), Figures(4, 300.0, 96.0, 150.0, 10.0), Figures(16, 500, 99, 900, 30)],
    )
    done = _zerogap_report(str(a), str(b), "--labels", "sync,async", "--out", str(tmp_path / "cmp"))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    for label, run in (("sync", a), ("async", b)):
        assert f"== {label}: {run} ==" in lines
        assert table(json.loads((run / "report.json").read_text(encoding="utf-8"))) in done.stdout
    assert (
        "async/sync at 2 users: output TPS 1.50x (100 -> 150 tok/s), GPU busy 1.20x (50 -> 60%), "
        "TTFT p50 0.80x (100.0 -> 80.0 ms), TPOT p50 1.00x (20.0 -> 20.0 ms)"
    ) in lines
    assert (
        "async/sync at 4 users: output TPS 1.50x (200 -> 300 tok/s), GPU busy 1.20x (80 -> 96%), "
        "TTFT p50 1.25x (120.0 -> 150.0 ms), TPOT p50 0.40x (25.0 -> 10.0 ms)"
    ) in lines
    assert "not compared (held by one run only): sync 8 users; async 16 users" in lines
    assert lines[-1] == f"zerogap report: {tmp_path / 'cmp' / 'report.html'}"


def test_a_ratio_with_a_figure_missing_or_zero_in_a_reads_a_dash() -> None:
    a = StepFigures(load=4, load_unit="users", output_tps=0.0, gpu_busy_pct=None, ttft_p50_ms=10.0, tpot_p50_ms=2.0)
    b = StepFigures(load=4, load_unit="users", output_tps=50.0, gpu_busy_pct=70.0, ttft_p50_ms=None, tpot_p50_ms=3.0)
    assert ratio_line(a, b, "A", "B") == (
        "B/A at 4 users: output TPS - (0 -> 50 tok/s), GPU busy - (- -> 70%), TTFT p50 - (10.0 -> - ms), "
        "TPOT p50 1.50x (2.0 -> 3.0 ms)"
    )


def test_open_loop_steps_match_by_request_rate_not_by_users() -> None:
    def step(rate: float, users: int, tps: float) -> StepFigures:
        step = {"request_rate": rate, "concurrency": users, "output_tps": tps, "gpu_util": None}
        return StepFigures.of_step({**step, "ttft_ms": {"p50": 5.0}, "tpot_ms": None})

    lines = ratio_lines([step(2.0, 7, 100.0)], [step(2.0, 9, 125.0), step(4.0, 7, 400.0)], "x", "y")
    assert lines == [
        "y/x at 2 req/s: output TPS 1.25x (100 -> 125 tok/s), GPU busy - (- -> -%), TTFT p50 1.00x (5.0 -> 5.0 ms), "
        "TPOT p50 - (- -> - ms)",
        "not compared (held by one run only): y 4 req/s",
    ]


def test_a_report_json_without_a_steps_figures_is_a_message(tmp_path: Path) -> None:
    run = write_report(tmp_path / "run", [Figures(2, 100.0, 50.0, 100.0, 20.0)])
    report = json.loads((run / "report.json").read_text(encoding="utf-8"))
    del report["steps"][0]["output_tps"]
    (run / "report.json").write_text(json.dumps(report), encoding="utf-8")
    done = _zerogap_report(str(run))
    assert done.returncode == 2
    assert "a step lacks a figure" in done.stderr and "output_tps" in done.stderr
    assert "Traceback" not in done.stderr
