"""Runs side by side: one page with TPS, GPU utilization, TPOT and the backends'
token interval against load for each run (`zerogap report A B`, `zerogap demo`)."""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from common.html_page import html_page, image_html
from loadreport.curves import draw_curves
from loadreport.plots import load_label, load_of
from loadreport.report import STYLE, ReportError, notes, read_report, steps_table

PANELS = (
    ("output_tps", "Output tokens/s", "tokens/s"),
    ("gpu_util", "GPU utilization (mean)", "%"),
    ("tpot_ms", "TPOT p50", "ms"),
    ("token_interval_ms", "Token interval: GPU idle between forwards (mean)", "ms"),
)


def _value(step: dict[str, Any], key: str) -> float:
    value = step.get(key)
    if isinstance(value, dict):
        value = value.get("mean") if key == "gpu_util" else value.get("p50")
    return float("nan") if value is None else float(value)


def plot_comparison(reports: list[dict[str, Any]], labels: list[str], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(12, 8), dpi=110)
    for ax, (key, title, unit) in zip(axes.flat, PANELS, strict=True):
        curves = [([load_of(s) for s in r["steps"]], [_value(s, key) for s in r["steps"]]) for r in reports]
        draw_curves(ax, curves, labels)
        ax.set_title(title)
        ax.set_ylabel(unit)
        ax.set_xlabel(load_label(reports[0]["steps"]))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        if key == "gpu_util":
            ax.set_ylim(0, 105)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def render_comparison(run_dirs: list[Path], labels: list[str], out_dir: Path) -> Path:
    """Write out_dir/report.html (+ compare.png, comparison.json); returns the HTML's path."""
    if len(labels) != len(run_dirs):
        raise ReportError(f"{len(run_dirs)} runs but {len(labels)} labels: give one label per run.")
    reports = [read_report(Path(run_dir))[0] for run_dir in run_dirs]
    out_dir.mkdir(parents=True, exist_ok=True)
    image = plot_comparison(reports, labels, out_dir / "compare.png")
    summary = {
        "runs": [
            {"label": label, "run_dir": str(run_dir), "steps": report["steps"], "knee": report.get("knee")}
            for label, run_dir, report in zip(labels, run_dirs, reports, strict=True)
        ]
    }
    (out_dir / "comparison.json").write_text(json.dumps(summary, indent=2), encoding="utf-8")
    title = "zerogap: " + " vs ".join(labels)
    body = [f"<h1>{html.escape(title)}</h1>", image_html(image.name, "comparison")]
    for label, run_dir, report in zip(labels, run_dirs, reports, strict=True):
        body.append(f"<h2>{html.escape(label)}</h2><p class=note>{html.escape(str(run_dir))}</p>")
        body += [f"<p>{html.escape(text)}</p>" for text in notes(report)]
        body.append(steps_table(report["steps"], label))
    out = out_dir / "report.html"
    out.write_text(html_page(title, body, STYLE), encoding="utf-8")
    return out
