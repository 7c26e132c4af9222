"""The step summary is report.json's typed Step: built strictly from the records and the timeline,
written to report.json as the fields that were set, and read back to the same Step and the same
diagnosis. A figure of the wrong type is zerogap's bug: it raises where the Step is built."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from loadreport.diagnosis import diagnose, diagnose_steps
from loadreport.record import Recorder
from loadreport.report import write_run
from loadreport.run_summary import summarize_run
from loadreport.schedule import LoadSchedule, Phase
from loadreport.schema import RunReport
from loadreport.settings import Settings, parse_settings
from loadreport.summary import summarize_step
from loadreport.timeline import Sample
from tests.loadtest.report_files import RUN_META, add_steady_requests

START = 1_000_000.0
CAP = 8  # the engines' summed max_num_seqs: at 16 users, 8 run and 8 wait


def _settings(extra: str = "") -> Settings:
    return parse_settings(
        '{"load_test": {"steps": [4, 16], "warmup_seconds": 0, "step_duration_seconds": 10, '
        f'"measure_last_seconds": 5}}{extra}}}'
    )


def _records(plan: LoadSchedule) -> Recorder:
    """Each user streams 10 tokens per request: TTFT 100 ms, then one token per 20 ms (E2E 280 ms)."""
    recorder = Recorder()
    for phase in plan.steps:
        add_steady_requests(recorder, phase, plan.users_for(phase), START)
    return recorder


def _samples(plan: LoadSchedule, cap: float = CAP) -> list[Sample]:
    """One scrape a second: as many running as the cap allows, the rest waiting, the KV cache at 30%."""
    samples = []
    for phase in plan.steps:
        running = min(phase.load, CAP)
        for tick in range(int(phase.start_s) + 1, int(phase.end_s) + 1):
            sample = Sample(START + tick, int(phase.load), 70.0, "", running, phase.load - running, 0.3, 3.0, 4.0)
            sample.max_num_seqs = cap  # type: ignore[assignment]  # an int; a float here is the test of a bug
            samples.append(sample)
    return samples


def test_a_step_round_trips_through_report_json_to_the_same_step_and_diagnosis(tmp_path: Path) -> None:
    settings = _settings()
    plan = LoadSchedule.from_settings(settings.load_test)
    recorder, samples = _records(plan), _samples(plan)
    summary = summarize_run(settings, plan, START, START + plan.total_s, recorder, samples)
    assert [entry.limit for entry in summary.diagnosis] == ["none", "batch_cap"]
    assert "running 8.0 of a cap of 8, waiting 8.0" in summary.diagnosis[1].evidence
    write_run(tmp_path, settings, plan, START, START + plan.total_s, summary, RUN_META, recorder, samples)

    text = (tmp_path / "report.json").read_text(encoding="utf-8")
    assert f'"max_num_seqs": {CAP},' in text  # an int stays an int in the file (not 8.0)
    read = RunReport.model_validate(json.loads(text))
    assert read.steps == summary.steps
    assert diagnose_steps(read.steps) == summary.diagnosis
    as_read = json.loads(text)
    assert diagnose(as_read["steps"]) == as_read["diagnosis"] == [entry.to_json() for entry in summary.diagnosis]
    first = as_read["steps"][0]  # the keys the step has are the ones it was built with
    assert "concurrency" in first and "request_rate" not in first and "tpot_ms_reason" not in first
    assert "request_rate" not in as_read["diagnosis"][0]


def test_a_figure_that_is_not_collected_is_null_with_its_reason_beside(tmp_path: Path) -> None:
    settings = _settings(', "workload": {"stream": false}, "metrics": {"collect_gpu_util": false}')
    plan = LoadSchedule.from_settings(settings.load_test)
    step = summarize_step(settings, plan, plan.steps[0], START, START + plan.total_s, _records(plan), [])
    assert step is not None and step.tpot_ms is None and step.itl_ms is None and step.gpu_util is None
    assert step.tpot_ms_reason is not None and "workload.stream is false" in step.tpot_ms_reason
    assert step.gpu_util_reason == "metrics.collect_gpu_util is false"
    assert set(step.not_collected) == {"tpot_ms", "itl_ms", "gpu_util"}
    assert {"tpot_ms_reason", "itl_ms_reason"} <= set(step.to_json())


@pytest.mark.parametrize(
    ("load_test", "load", "field"),
    [
        ('"steps": [4, 16]', "16", "concurrency"),  # strict: lenient validation would take "16" as 16.0
        ('"steps": [4, 16], "request_rate": 1, "concurrency": 8', "sixteen", "request_rate"),
    ],
)
def test_a_wrong_type_in_a_step_raises_where_it_is_built(load_test: str, load: str, field: str) -> None:
    settings = parse_settings(f'{{"load_test": {{{load_test}, "warmup_seconds": 0}}}}')
    plan = LoadSchedule.from_settings(settings.load_test)
    phase = Phase(0, load, 0.0, 10.0, 5.0)  # type: ignore[arg-type]  # the bug under test
    with pytest.raises(ValidationError, match=rf"{field}\n  Input should be a valid number"):
        summarize_step(settings, plan, phase, START, START + plan.total_s, _records(plan), [])


def test_a_float_cap_is_refused_where_the_backend_figures_are_built() -> None:
    settings = _settings()
    plan = LoadSchedule.from_settings(settings.load_test)
    with pytest.raises(ValidationError, match="max_num_seqs"):
        summarize_step(settings, plan, plan.steps[1], START, START + plan.total_s, _records(plan), _samples(plan, 8.0))


def test_a_report_that_does_not_fit_its_schema_raises_and_writes_no_report_json(tmp_path: Path) -> None:
    settings = _settings()
    plan = LoadSchedule.from_settings(settings.load_test)
    recorder = _records(plan)
    summary = summarize_run(settings, plan, START, START + plan.total_s, recorder, [])
    with pytest.raises(ValidationError, match="num_worker_processes"):
        meta = {**RUN_META, "num_worker_processes": "1"}
        write_run(tmp_path, settings, plan, START, START + plan.total_s, summary, meta, recorder, [])
    assert not (tmp_path / "report.json").exists()
