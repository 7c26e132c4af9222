"""What the real `locust -f loadtest/ --headless` prints against a real sim: a progress line
every --progress-seconds through each step (judged by the lines' own clocks), no Locust
request table every 2 s unless --print-stats asks for it, and each step's final line with
the same output tok/s as the final table and report.json."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest

from backends.sim.testing import SimProcess, run_sim_process
from tests.loadtest.helpers import read_report, run_locust, write_settings

PROGRESS_S = 1  # --progress-seconds in these runs (the default is 5)
MAX_GAP_S = 3 * PROGRESS_S  # the lines' clocks are whole seconds, and a busy machine delays a beat
STEP_S = 4
PROGRESS = re.compile(r"^zerogap progress: step (\d+)/2, .*?, (\d+) s of (\d+) s \((\d+) s left\): (.*)$")
FINAL = re.compile(r"^zerogap step (\d+)/2 (\d+) users: output ([\d,]+) tok/s")
TABLE_ROW = re.compile(r"^\s+(\d+) users\s+([\d,]+)\s")
LOCUST_TABLE_HEADER = "# fails"  # the header of Locust's request table (stats_printer's, and the summary's)


def settings_for(tmp_path: Path, sim: SimProcess, name: str, steps: list[int], step_s: float = STEP_S) -> Path:
    return write_settings(
        tmp_path / f"{name}.json", sim.url, tmp_path / "runs", name,
        load_test={"steps": steps, "warmup_seconds": 0, "step_duration_seconds": step_s, "measure_last_seconds": 3},
        workload={"model": sim.model, "input_tokens": 16, "max_output_tokens": 16},
        metrics={"backend_metrics_urls": [f"{sim.url}/metrics"]},
    )  # fmt: skip


def progress_stamps(stdout: str) -> dict[int, list[int]]:
    """Step number -> the elapsed seconds its progress lines state, in order."""
    stamps: dict[int, list[int]] = {}
    for line in stdout.splitlines():
        found = PROGRESS.match(line)
        if found:
            step, elapsed, length, left = (int(found.group(i)) for i in range(1, 5))
            assert length == STEP_S and elapsed + left in (STEP_S - 1, STEP_S, STEP_S + 1), line
            assert "output " in found.group(5) and "GPU " in found.group(5) and " failed" in found.group(5), line
            stamps.setdefault(step, []).append(elapsed)
    return stamps


@pytest.mark.slow
def test_progress_lines_through_each_step_and_one_figure_per_step(tmp_path: Path) -> None:
    with run_sim_process(model="progress") as sim:
        result = run_locust(settings_for(tmp_path, sim, "progress", [2, 4]), "--progress-seconds", str(PROGRESS_S))
        table_asked = run_locust(settings_for(tmp_path, sim, "table", [2], 3), "--print-stats")
    assert result.returncode == 0, result.stderr[-3000:]
    stamps = progress_stamps(result.stdout)
    assert sorted(stamps) == [1, 2], result.stdout
    for step, elapsed in stamps.items():
        # a line at least every MAX_GAP_S of the step by its own clock, from its start to its end
        edges = [0, *elapsed, STEP_S]
        gaps = [later - earlier for earlier, later in itertools.pairwise(edges)]
        assert max(gaps) <= MAX_GAP_S and len(elapsed) >= STEP_S // MAX_GAP_S + 1, (step, elapsed)
    assert re.search(r"^zerogap progress: .*: output [\d,]+ tok/s, GPU \d+%", result.stdout, re.M), result.stdout
    # Locust's own table: once, in its summary at the end; not every 2 s
    assert result.stderr.count(LOCUST_TABLE_HEADER) == 1, result.stderr[-3000:]
    assert table_asked.returncode == 0, table_asked.stderr[-3000:]
    assert table_asked.stderr.count(LOCUST_TABLE_HEADER) >= 2, table_asked.stderr[-3000:]  # --print-stats: back

    lines = result.stdout.splitlines()
    finals = {int(m.group(1)): m.group(3) for m in map(FINAL.match, lines) if m}
    rows = {int(m.group(1)): m.group(2) for m in map(TABLE_ROW.match, lines) if m}
    report = read_report(tmp_path / "runs" / "progress")
    in_report = {step["concurrency"]: f"{step['output_tps']:,.0f}" for step in report["steps"]}
    assert finals == {1: in_report[2], 2: in_report[4]}, (finals, in_report, result.stdout)
    assert rows == {2: in_report[2], 4: in_report[4]}, (rows, in_report, result.stdout)
