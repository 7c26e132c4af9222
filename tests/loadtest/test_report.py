"""report.json / timeline.csv / report.html from a synthetic run (known records and samples)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import jsonschema
import pytest
from pydantic import ValidationError

from loadreport.compare import render_comparison
from loadreport.console import HEADER, table
from loadreport.record import Recorder, RequestRecord
from loadreport.report import render_run, write_run
from loadreport.report_cli import main as report_main
from loadreport.run_summary import find_knee, summarize_run
from loadreport.schedule import LoadSchedule
from loadreport.schema import RunReport, Step, json_schema
from loadreport.settings import parse_settings
from loadreport.timeline import Sample
from tests.loadtest.diagnosis_steps import step as typed_step
from tests.loadtest.report_files import RUN_META, add_steady_requests
from tests.support import REPO, zerogap_cmd

PNG = b"\x89PNG\r\n\x1a\n"
START = 1_000_000.0


def synthetic_run(run_dir: Path, busy: float, interval_ms: float, plots: bool = True) -> Path:
    """Steps of 2 and 4 users, 10 s each, measured over the last 5 s; each user streams
    10 tokens per request: TTFT 100 ms, then one token per 20 ms (E2E 280 ms)."""
    settings = parse_settings(
        '{"load_test": {"steps": [2, 4], "warmup_seconds": 0, "step_duration_seconds": 10, '
        '"measure_last_seconds": 5}, "metrics": {"backend_metrics_urls": ["http://127.0.0.1:1/metrics"]}, '
        f'"output": {{"plots": {json.dumps(plots)}}}}}'
    )
    plan = LoadSchedule.from_settings(settings.load_test)
    run_dir.mkdir(parents=True, exist_ok=True)
    recorder, samples = Recorder(), []
    for phase in plan.steps:
        add_steady_requests(recorder, phase, int(phase.load), START)
        for tick in range(int(phase.start_s) + 1, int(phase.end_s) + 1):
            sample = Sample(START + tick, int(phase.load), busy * 100, "", phase.load, 0.0, 0.3, interval_ms, 14.0)
            samples.append(sample)
            recorder.add_cpu("host:1", START + tick, 20.0)
    summary = summarize_run(settings, plan, START, START + plan.total_s, recorder, samples)
    return write_run(run_dir, settings, plan, START, START + plan.total_s, summary, RUN_META, recorder, samples)


def test_report_json_has_the_contract_fields_and_the_right_figures(tmp_path: Path) -> None:
    html = synthetic_run(tmp_path, busy=0.6, interval_ms=12.0)
    report = json.loads((tmp_path / "report.json").read_text())
    first, second = report["steps"]
    assert first["concurrency"] == 2 and second["concurrency"] == 4
    assert abs(first["output_tps"] - 2 * 10 / 0.28) / (2 * 10 / 0.28) < 0.05
    assert abs(second["output_tps"] - 4 * 10 / 0.28) / (4 * 10 / 0.28) < 0.05
    assert first["ttft_ms"]["p50"] == 100.0
    assert first["tpot_ms"]["p50"] == 20.0
    assert first["itl_ms"] == {"p50": 20.0, "p90": 20.0, "p99": 20.0, "mean": 20.0}
    assert first["e2e_ms"]["p99"] == 280.0
    assert first["gpu_util"] == {"mean": 60.0, "min": 60.0}
    assert first["token_interval_ms"] == 12.0 and first["cpu_interval_ms"] == 14.0
    assert first["duration_s"] == 5.0 and first["valid"] is True
    assert first["token_count_source"] == "usage"
    assert first["goodput_rps"] == first["rps"]
    for key in ("requests_ok", "requests_failed", "total_tps", "rps", "gpu_util", "goodput_rps", "valid"):
        assert key in first
    assert html.name == "report.html"
    page = html.read_text()
    for png in ("vs_load.png", "timeline.png"):
        assert f'src="{png}"' in page
        assert (tmp_path / png).read_bytes().startswith(PNG)
    header = (tmp_path / "timeline.csv").read_text().splitlines()[0]
    assert header.startswith("time_s,phase,users,output_tps") and "token_interval_ms,cpu_interval_ms" in header
    row = table(report).splitlines()[1]
    for column, value in ((" gap", "12.0"), (" CPU", "14.0")):  # the console: right-aligned under the header
        end = HEADER.index(column) + len(column)
        assert row[end - 6 : end].strip() == value, (column, row)
    assert "the GPU's idle time between two forwards" in table(report)


def test_output_plots_false_draws_none_and_zerogap_report_draws_them_later(tmp_path: Path) -> None:
    page = synthetic_run(tmp_path, busy=0.6, interval_ms=12.0, plots=False).read_text()
    assert not list(tmp_path.glob("*.png")) and "<img" not in page
    assert "output.plots false" in page and "zerogap report RUN_DIR" in page
    assert "<table class=steps" in page  # the rest of the report is all there
    redrawn = render_run(tmp_path).read_text()  # what `zerogap report RUN_DIR` does
    assert sorted(p.name for p in tmp_path.glob("*.png")) == ["timeline.png", "vs_load.png"]
    assert 'src="vs_load.png"' in redrawn and "output.plots false" not in redrawn


def test_saturated_load_generator_invalidates_the_step(tmp_path: Path) -> None:
    synthetic_run(tmp_path, busy=0.5, interval_ms=1.0)
    report = json.loads((tmp_path / "report.json").read_text())
    assert all(step["valid"] for step in report["steps"])
    settings = parse_settings('{"metrics": {"saturation_cpu_percent": 15}}')
    plan = LoadSchedule.from_settings(parse_settings('{"load_test": {"steps": [1], "warmup_seconds": 0}}').load_test)
    recorder = Recorder()
    recorder.add_cpu("host:1", START + 100, 99.0)
    step = summarize_run(settings, plan, START, START + plan.total_s, recorder, []).steps[0]
    assert step.valid is False and step.invalid_reason is not None and "CPU 99%" in step.invalid_reason
    assert step.gpu_util is None and step.gpu_util_reason


@pytest.mark.parametrize(("measure_last_s", "leaks"), [(8.5, True), (7.5, False)])
def test_a_window_that_starts_within_a_request_of_the_step_start_is_invalid(measure_last_s, leaks) -> None:
    """Requests of 2 s back to back, steps of 10 s: the first step's two users send at
    9.6 and 9.8 s. A window that starts 1.5 s into the second step measures those
    requests (sent under the lighter load); one 2.5 s in does not."""
    settings = parse_settings(
        f'{{"load_test": {{"steps": [2, 4], "warmup_seconds": 0, "step_duration_seconds": 10, '
        f'"measure_last_seconds": {measure_last_s}}}}}'
    )
    plan = LoadSchedule.from_settings(settings.load_test)
    recorder = Recorder()
    for user in range(4):
        sent = START + (1.6 + 0.2 * user if user < 2 else 10.0 + 0.1 * user)
        while sent + 2.0 <= START + plan.total_s:
            recorder.add(RequestRecord(sent, sent + 2.0, True, "", 0.1, 2.0, 10, 50, "usage", None), [sent + 2.0])
            sent += 2.0
    first, second = summarize_run(settings, plan, START, START + plan.total_s, recorder, []).steps
    assert first.valid is True  # nothing ran before it
    assert second.valid is not leaks
    if leaks:
        assert second.invalid_reason is not None and "window shorter than a request" in second.invalid_reason
        assert "2 of the" in second.invalid_reason  # the two first-step users' requests in flight at 10 s
    else:
        assert second.invalid_reason is None


def test_knee_is_the_step_after_which_tps_stalls_while_latency_grows() -> None:
    def step(index: int, load: int, tps: float, tpot: float) -> Step:
        return typed_step(users=load, tps=tps, tpot_p50=tpot, ttft_p50=10.0, index=index)

    knee = find_knee([step(0, 32, 1000, 10), step(1, 128, 3000, 12), step(2, 256, 3100, 25)])
    assert knee is not None and knee.load == 128 and knee.step == 1
    assert knee.text == "TPS grows 3.3% after 128.0 while latency grows: more load only queues"
    assert find_knee([step(0, 32, 1000, 10), step(1, 128, 3000, 12)]) is None
    # the threshold: TPS growing just under 10% to the next step is the knee, 10% is not
    assert find_knee([step(0, 32, 1000, 10), step(1, 64, 1099, 12)]) is not None
    assert find_knee([step(0, 32, 1000, 10), step(1, 64, 1100, 12)]) is None
    assert find_knee([step(0, 32, 1000, 10), step(1, 64, 1000, 10)]) is None  # latency holds: no knee


@pytest.mark.slow
def test_rerender_and_compare(tmp_path: Path) -> None:
    sync = synthetic_run(tmp_path / "sync", 0.55, 20.0).parent
    fast = synthetic_run(tmp_path / "async", 0.95, 0.0).parent
    (sync / "report.html").unlink()
    assert report_main([str(sync)]) == 0
    assert (sync / "report.html").is_file()
    out = render_comparison([sync, fast], ["sync", "async"], tmp_path / "cmp")
    assert (tmp_path / "cmp" / "compare.png").read_bytes().startswith(PNG)
    page = out.read_text()
    assert "sync" in page and "async" in page
    cmd = zerogap_cmd("report", str(sync), str(fast), "--labels", "a,b", "--out", str(tmp_path / "cmp2"))
    result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == f"zerogap report: {tmp_path / 'cmp2' / 'report.html'}"
    assert (tmp_path / "cmp2" / "compare.png").read_bytes().startswith(PNG)
    assert render_run(fast).is_file()


def test_report_cli_errors_are_messages(tmp_path: Path, capsys) -> None:
    assert report_main([str(tmp_path / "absent")]) == 2
    assert "no such folder" in capsys.readouterr().err
    assert report_main([str(tmp_path)]) == 2
    assert "no report.json" in capsys.readouterr().err


def test_the_published_schema_is_current() -> None:
    published = (REPO / "loadtest" / "report.schema.json").read_text(encoding="utf-8")
    assert published == json_schema(), (
        "regenerate it: .venv/bin/python -c 'import loadreport.schema as s; print(s.json_schema(), end=\"\")' "
        "> loadtest/report.schema.json"
    )


def test_the_schema_refuses_an_unknown_or_mistyped_field(tmp_path: Path) -> None:
    synthetic_run(tmp_path, busy=0.6, interval_ms=12.0)
    good = json.loads((tmp_path / "report.json").read_text(encoding="utf-8"))
    RunReport.model_validate(good)
    published = json.loads((REPO / "loadtest" / "report.schema.json").read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator(published).validate(good)  # what a reader in any language uses
    with pytest.raises(jsonschema.ValidationError, match="surprise"):
        jsonschema.Draft202012Validator(published).validate({**good, "surprise": 1})
    with pytest.raises(ValidationError, match=r"steps\.0\.surprise"):
        RunReport.model_validate({**good, "steps": [{**good["steps"][0], "surprise": 1}]})
    with pytest.raises(ValidationError, match=r"diagnosis\.0\.limit"):
        RunReport.model_validate({**good, "diagnosis": [{**good["diagnosis"][0], "limit": "gpu"}]})
