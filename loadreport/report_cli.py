"""`zerogap report RUN_DIR` renders a run's report.html again from report.json and
timeline.csv and prints its table; `zerogap report A B [...]` puts runs side by side and
prints each run's table and the ratios of each later run to the first, step by step."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from loadreport.compare import render_comparison
from loadreport.console import table
from loadreport.ratios import report_ratio_lines
from loadreport.report import ReportError, read_report, render_run


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="zerogap report",
        description="Render a load-test run's report.html again and print its table, or compare runs side by side.",
    )
    parser.add_argument("runs", nargs="+", type=Path, help="run folder(s) (each holds report.json)")
    parser.add_argument("--labels", default="", help="comma-separated names for the runs (default: folder names)")
    parser.add_argument("--out", type=Path, default=None, help="where a comparison goes (default: next to run A)")
    return parser


def _one(run_dir: Path) -> None:
    page = render_run(run_dir)
    print(table(read_report(run_dir)[0]))
    print(f"zerogap report: {page}")


def _many(runs: list[Path], labels: list[str], out: Path) -> None:
    page = render_comparison(runs, labels, out)
    reports = [read_report(run)[0] for run in runs]
    for label, run, report in zip(labels, runs, reports, strict=True):
        print(f"== {label}: {run} ==")
        print(table(report), end="\n\n")
    print("ratios per step, matched by load (times in ms; GPU busy: mean GPU utilization):")
    for label, report in zip(labels[1:], reports[1:], strict=True):
        print("\n".join(report_ratio_lines(reports[0], report, labels[0], label)))
    print(f"zerogap report: {page}")


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    runs: list[Path] = args.runs
    try:
        if len(runs) == 1:
            _one(runs[0])
            return 0
        labels = [label.strip() for label in args.labels.split(",")] if args.labels else [r.name for r in runs]
        out = args.out or runs[0].resolve().parent / ("compare-" + "-vs-".join(r.resolve().name for r in runs))
        _many(runs, labels, out)
        return 0
    except ReportError as exc:
        print(f"zerogap report: {exc}", file=sys.stderr)
        return 2
    except (KeyError, TypeError, ValueError) as exc:  # a report.json edited by hand, or not zerogap's
        where = ", ".join(str(run / "report.json") for run in runs)
        print(f"zerogap report: {where}: a step lacks a figure or holds a wrong one ({exc!r}).", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main(sys.argv[1:]))
