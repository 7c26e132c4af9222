"""The run folder: report.json, timeline.csv, settings.json (as used; no key is ever
in it) and report.html with its PNGs. render_run() redraws the HTML and PNGs from
report.json and timeline.csv alone, which is what `zerogap report RUN_DIR` does."""

from __future__ import annotations

import html
import json
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from common.html_page import html_page, image_html
from loadreport.collect import blank_uncollected
from loadreport.console import load_text
from loadreport.diagnosis import diagnose, headline
from loadreport.plots import plot_timeline, plot_vs_load
from loadreport.record import INTERRUPTED, Recorder
from loadreport.requests_csv import write_requests
from loadreport.run_header import run_header
from loadreport.run_summary import RunSummary
from loadreport.schedule import LoadSchedule
from loadreport.schema import RunReport
from loadreport.settings import OutputSection, Settings
from loadreport.timeline import Sample, build_rows, read_csv, write_csv
from loadreport.verdict import ITL_MEANING, itl_note, knee_sentence, run_verdict

REPORT_VERSION = 1


class ReportError(Exception):
    """A run folder that cannot be rendered; str() is the message for the user."""


def utc(wall: float) -> str:
    return datetime.fromtimestamp(wall, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def new_run_dir(output: OutputSection) -> Path:
    name = output.run_name or datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    path = Path(output.dir) / name
    suffix = 1
    while path.exists() and any(path.iterdir()):
        suffix += 1
        path = Path(output.dir) / f"{name}-{suffix}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def write_run(
    run_dir: Path,
    settings: Settings,
    plan: LoadSchedule,
    run_start: float,
    run_end: float,
    summary: RunSummary,
    meta: dict[str, Any],
    recorder: Recorder,
    samples: list[Sample],
    planned_lengths: Mapping[int, tuple[int, int]] | None = None,
) -> Path:
    """The run folder. report.json is built strictly (RunReport.build): a figure that does not fit its
    schema is zerogap's bug and raises pydantic.ValidationError, as a step's figure does where it is built."""
    report = RunReport.build(
        zerogap_report=REPORT_VERSION,
        run={
            "name": run_dir.name,
            "started_utc": utc(run_start),
            "started_unix_s": round(run_start, 6),
            "ended_utc": utc(run_end),
            "duration_s": round(run_end - run_start, 3),
            **meta,
        },
        slo=settings.slo.model_dump(),
        steps=summary.steps,
        knee=summary.knee,
        diagnosis=summary.diagnosis,
        errors=_errors(recorder),
        totals=_totals(recorder),
    )
    (run_dir / "report.json").write_text(json.dumps(report.to_json(), indent=2), encoding="utf-8")
    write_csv(blank_uncollected(settings, build_rows(samples, recorder, plan, run_start)), run_dir / "timeline.csv")
    (run_dir / "settings.json").write_text(settings.model_dump_json(indent=2), encoding="utf-8")
    write_requests(run_dir / "requests.csv", recorder.records, run_start, planned_lengths)
    return render_run(run_dir, settings.output.plots)


def _totals(recorder: Recorder) -> dict[str, int]:
    """The whole run (warm-up and every process included), for checking that it adds up."""
    ok = [r for r in recorder.records if r.ok]
    return {
        "requests_ok": len(ok),
        "requests_failed": sum(1 for r in recorder.records if not r.ok and r.error_kind != INTERRUPTED),
        "requests_interrupted": sum(1 for r in recorder.records if r.error_kind == INTERRUPTED),
        "output_tokens_ok": sum(r.output_tokens for r in ok),
    }


def _errors(recorder: Recorder) -> dict[str, int]:
    counts: dict[str, int] = {}
    for record in recorder.records:
        if not record.ok and record.error_kind != INTERRUPTED:
            counts[record.error_kind] = counts.get(record.error_kind, 0) + 1
    return counts


def read_report(run_dir: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    report_path, timeline_path = run_dir / "report.json", run_dir / "timeline.csv"
    if not run_dir.is_dir():
        raise ReportError(f"{run_dir}: no such folder. Pass a run folder (it holds report.json).")
    if not report_path.is_file():
        raise ReportError(f"{run_dir}: no report.json in it. Pass a run folder that a load test wrote.")
    try:
        report = json.loads(report_path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise ReportError(f"{report_path}: not valid JSON ({exc}).") from None
    if not isinstance(report, dict) or not isinstance(report.get("steps"), list):
        raise ReportError(f"{report_path}: not a zerogap report (no steps list).")
    if not timeline_path.is_file():
        return report, []
    rows = read_csv(timeline_path)
    return report, rows


def render_run(run_dir: Path, plots: bool = True) -> Path:
    """report.html, and its PNGs unless plots is False (output.plots: matplotlib's import and the two
    plots are ~3 s of CPU on a small machine; `zerogap report RUN_DIR` draws them later)."""
    report, rows = read_report(run_dir)
    images = []
    if plots and report["steps"]:  # no empty plots
        images.append(plot_vs_load(report, run_dir / "vs_load.png").name)
    if plots and rows:
        images.append(plot_timeline(report, rows, run_dir / "timeline.png").name)
    out = run_dir / "report.html"
    title = f"zerogap load test {report['run'].get('name', run_dir.name)}"
    out.write_text(page(title, report, images, plots_off=not plots), "utf-8")
    return out


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.1f}"
    return html.escape(str(value))


def _lag_cell(lag: dict[str, float | None] | None) -> str | None:
    return "/".join(_cell(lag[p]) for p in ("p50", "p90")) if lag else None


def _percent(rate: float | None) -> str | None:
    return None if rate is None else f"{rate * 100:.1f}"


def _gpu_cell(gpu: dict[str, float] | None) -> str | None:
    return f"{gpu['mean']:.0f}/{gpu['min']:.0f}" if gpu else None


def _pcts(step: dict[str, Any], key: str, pcts: tuple[str, ...]) -> str | None:
    figures = step.get(key)
    return "/".join(_cell(figures[p]) for p in pcts) if figures else None


STEP_COLUMNS = (
    ("output tok/s", lambda s: s["output_tps"]),
    ("total tok/s", lambda s: s["total_tps"]),
    ("req/s", lambda s: s["rps"]),
    ("TTFT p50/p90/p99 ms", lambda s: _pcts(s, "ttft_ms", ("p50", "p90", "p99"))),
    ("prefix-cache hit %", lambda s: _percent(s.get("prefix_cache_hit_rate"))),
    ("cached prompt %", lambda s: _percent(s.get("cached_prompt_share"))),
    (
        "TTFA p50/p99 ms (first answer token)",
        lambda s: _pcts(s, "ttfa_ms", ("p50", "p99")) if s.get("reasoning_ms") else None,
    ),
    ("reasoning tokens", lambda s: s.get("reasoning_tokens_mean")),
    ("TPOT p50/p90/p99 ms", lambda s: _pcts(s, "tpot_ms", ("p50", "p90", "p99"))),
    ("ITL p50/p99 ms", lambda s: _pcts(s, "itl_ms", ("p50", "p99"))),
    ("E2E p50/p99 ms", lambda s: _pcts(s, "e2e_ms", ("p50", "p99"))),
    ("GPU mean/min %", lambda s: _gpu_cell(s["gpu_util"])),
    ("token interval ms (GPU idle between forwards)", lambda s: s.get("token_interval_ms")),
    ("CPU interval ms (work per step)", lambda s: s.get("cpu_interval_ms")),
    ("goodput req/s", lambda s: s["goodput_rps"]),
    ("ok / failed", lambda s: f"{s['requests_ok']} / {s['requests_failed']}"),
    ("load-gen CPU %", lambda s: s.get("loadgen_cpu_percent")),
    ("send lag p50/p90 ms", lambda s: _lag_cell(s.get("send_lag_ms"))),
    ("valid", lambda s: "yes" if s["valid"] else f"NO: {s['invalid_reason']}"),
    ("tokens from", lambda s: s["token_count_source"]),
)


def _breakable(escaped: str) -> str:
    """Escaped text that may wrap after each "/" (p50/p90/p99 figures), so the wide table fits narrower pages."""
    return escaped.replace("/", "/<wbr>")


def steps_table(steps: list[dict[str, Any]], label: str = "") -> str:
    """One row a step; a column that no step has a figure for (reasoning, cached tokens, the
    engines' intervals, ...) is left out, so the table fits the page."""
    columns = [(name, get) for name, get in STEP_COLUMNS if any(get(step) is not None for step in steps)]
    head = "".join(f"<th>{_breakable(html.escape(name))}</th>" for name, _ in columns)
    lines = [f"<div class=wide><table class=steps><tr>{'<th>run</th>' if label else ''}<th>load</th>{head}</tr>"]
    for step in steps:
        cells = "".join(f"<td>{_breakable(_cell(get(step)))}</td>" for _, get in columns)
        run_cell = f"<td>{html.escape(label)}</td>" if label else ""
        lines.append(f"<tr>{run_cell}<td>{html.escape(load_text(step))}</td>{cells}</tr>")
    lines.append("</table></div>")
    return "\n".join(lines)


STYLE = (  # on top of the page's base style: a wide steps table wraps its headings, and scrolls inside its own
    # box if it still does not fit
    "table.diagnosis td,table.diagnosis th{text-align:left}.wide{overflow-x:auto;max-width:100%}"
    "table.steps{font-size:12px}table.steps th{font-weight:600;min-width:4em;max-width:8em}"
    "table.steps td{max-width:16em}"
)


def diagnosis_of(report: dict[str, Any]) -> list[dict[str, Any]]:
    """report.json's diagnosis; for a report written before there was one, worked out from its steps."""
    found = report.get("diagnosis")
    return found if isinstance(found, list) and (found or not report["steps"]) else diagnose(report["steps"])


def diagnosis_table(report: dict[str, Any]) -> str:
    lines = ["<table class=diagnosis><tr><th>load</th><th>limit</th><th>evidence</th><th>advice</th></tr>"]
    for entry in diagnosis_of(report):
        cells = "".join(f"<td>{html.escape(str(entry[k]))}</td>" for k in ("limit", "evidence", "advice"))
        lines.append(f"<tr><td>{_cell(entry.get('request_rate', entry['concurrency']))}</td>{cells}</tr>")
    lines.append("</table>")
    return "\n".join(lines)


def notes(report: dict[str, Any]) -> list[str]:
    steps = report["steps"]
    out = [headline(diagnosis_of(report)), knee_sentence(report)] if steps else []
    out += run_verdict(report)
    itl = itl_note(report)
    if itl is not None:
        out.append(itl)
    skipped = report["steps"][0].get("not_collected") if report["steps"] else None
    if skipped:
        out.append("Not collected: " + "; ".join(f"{k} ({v})" for k, v in skipped.items()) + ".")
    for step in report["steps"]:
        if step["gpu_util"] is None and "gpu_util" not in (step.get("not_collected") or {}):
            out.append(f"GPU utilization at {load_text(step)}: not available ({step['gpu_util_reason']}).")
        if step["token_count_source"] == "chunks":
            out.append(f"At {load_text(step)} the server sent no usage: output tokens are counted chunks.")
    if report.get("errors"):
        out.append("Errors by kind: " + ", ".join(f"{k}: {v}" for k, v in report["errors"].items()))
    return out


def page(title: str, report: dict[str, Any], images: list[str], plots_off: bool = False) -> str:
    body = [f"<h1>{html.escape(title)}</h1>", run_header(report)]
    body += [f"<p>{html.escape(text)}</p>" for text in notes(report)]
    if report["steps"]:
        body.append(steps_table(report["steps"]))
        body.append("<h2>Why TPS stops growing</h2>")
        body.append(diagnosis_table(report))
    body += [image_html(name, name) for name in images]
    if plots_off:
        body.append(
            "<p class=note>No plots: this run's settings have output.plots false. "
            "<code>zerogap report RUN_DIR</code> draws them from this folder.</p>"
        )
    body.append(
        "<p class=note>Latencies in ms at 0.1 ms resolution, over each step's measured window. "
        f"{html.escape(ITL_MEANING)}.</p>"
    )
    return html_page(title, body, STYLE)
