"""`zerogap report RUN_DIR` renders a run's report.html again from report.json and
timeline.csv; `zerogap report A B [...]` puts runs side by side."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from loadtest._compare import render_comparison
from loadtest._report import ReportError, render_run


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="zerogap report",
        description="Render a load-test run's report.html again, or compare runs side by side.",
    )
    parser.add_argument("runs", nargs="+", type=Path, help="run folder(s) (each holds report.json)")
    parser.add_argument("--labels", default="", help="comma-separated names for the runs (default: folder names)")
    parser.add_argument("--out", type=Path, default=None, help="where a comparison goes (default: next to run A)")
    return parser


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    runs: list[Path] = args.runs
    try:
        if len(runs) == 1:
            print(render_run(runs[0]))
            return 0
        labels = [label.strip() for label in args.labels.split(",")] if args.labels else [r.name for r in runs]
        out = args.out or runs[0].resolve().parent / ("compare-" + "-vs-".join(r.resolve().name for r in runs))
        print(render_comparison(runs, labels, out))
        return 0
    except ReportError as exc:
        print(f"zerogap report: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main(sys.argv[1:]))
