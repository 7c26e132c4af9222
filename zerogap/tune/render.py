"""What tune leaves behind: the console table, DIR/tune.json, DIR/report.html (TPS
and GPU utilization against concurrency per candidate) and DIR/best.toml."""

from __future__ import annotations

import html
import json
import math
from pathlib import Path
from typing import Any

from common.html_page import html_page, image_html
from loadtest import Curve, curve_styles, draw_curves
from zerogap.tune.rank import Result
from zerogap.tune.toml_text import paste_lines
from zerogap.tune.trial import Trial


def number(value: Any, spec: str) -> str:
    """A figure as the table prints it ("-" when there is none)."""
    return "-" if value is None else format(value, spec)


def _p50(figures: Any) -> Any:
    return figures.get("p50") if isinstance(figures, dict) else None


def table(ranked: list[Result]) -> str:
    width = max(len(r.candidate.label) for r in ranked)
    head = f"{'#':>2} {'candidate':<{width}} {'good/s':>7} {'out tok/s':>10} {'at':>5} {'TTFT p50':>9} "
    lines = [head + f"{'TPOT p50':>9} {'GPU':>5}  limit at the top step"]
    for place, r in enumerate(ranked, 1):
        j = r.as_json()
        gpu = j["gpu_util"]["mean"] if isinstance(j["gpu_util"], dict) else None
        lines.append(
            f"{place:>2} {r.candidate.label:<{width}} {number(j['goodput_rps'], '.2f'):>7} "
            f"{number(j['output_tps'], ',.0f'):>10} {number(j['best_concurrency'], 'g'):>5} "
            f"{number(_p50(j['ttft_ms']), '.1f'):>9} {number(_p50(j['tpot_ms']), '.1f'):>9} {number(gpu, '.0f'):>4}%  "
            f"{j['limit']}: {j['evidence']}"
        )
    return "\n".join(lines)


def tune_json(ranked: list[Result], trial: Trial) -> dict[str, Any]:
    best = ranked[0]
    return {
        "candidates": [r.as_json() for r in ranked],
        "best": {"settings": best.candidate.settings, "config_toml": paste_lines(best.candidate.settings)},
        "plan": {  # tune.json's name for the trial (an output format: kept)
            "engine": trial.engine,
            "virtual": trial.virtual,
            "steps": list(trial.steps),
            "step_seconds": trial.step_s,
            "measure_seconds": trial.measure_s,
            "slo": {"ttft_ms": trial.slo_ttft_ms, "tpot_ms": trial.slo_tpot_ms},
            "input_tokens": trial.input_tokens,
            "output_tokens": trial.output_tokens,
        },
    }


def _curves(ranked: list[Result]) -> tuple[list[Curve], list[Curve]]:
    """Each candidate's (concurrency, output TPS) and (concurrency, mean GPU utilization) curves."""
    tps: list[Curve] = []
    gpu: list[Curve] = []
    for r in ranked:
        loads = [float(s.get("concurrency", 0)) for s in r.steps]
        tps.append((loads, [float(s.get("output_tps") or 0.0) for s in r.steps]))
        gpu.append((loads, [float(s["gpu_util"]["mean"]) if s.get("gpu_util") else math.nan for s in r.steps]))
    return tps, gpu


def repeated_curves(ranked: list[Result]) -> list[tuple[str, str]]:
    """(candidate, the earlier candidate) for each candidate whose TPS and GPU curves both repeat another's."""
    labels = [r.candidate.label for r in ranked]
    tps, gpu = _curves(ranked)
    both = zip(curve_styles(tps, labels), curve_styles(gpu, labels), labels, strict=True)
    return [(label, t.same_as) for t, g, label in both if t.same_as is not None and t.same_as == g.same_as]


def _plot(ranked: list[Result], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (tps, gpu) = plt.subplots(1, 2, figsize=(12, 4.5), dpi=110)
    labels = [r.candidate.label for r in ranked]
    for ax, curves in zip((tps, gpu), _curves(ranked), strict=True):
        draw_curves(ax, curves, labels)
    for ax, title, unit in ((tps, "Output tokens/s", "tokens/s"), (gpu, "GPU utilization (mean)", "%")):
        ax.set_title(title)
        ax.set_xlabel("concurrency (users)")
        ax.set_ylabel(unit)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    gpu.set_ylim(0, 105)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


STYLE = "td,th{padding:4px 8px;text-align:left}"  # on top of the page's base style: the table is words


def _rows(ranked: list[Result]) -> str:
    head = "<tr><th>#</th><th>candidate</th><th>goodput req/s</th><th>output tok/s</th><th>limit</th>"
    out = [f"<table>{head}<th>evidence</th><th>advice</th></tr>"]
    for place, r in enumerate(ranked, 1):
        j = r.as_json()
        cells = [place, j["label"], j["goodput_rps"], j["output_tps"], j["limit"], j["evidence"], j["advice"]]
        out.append("<tr>" + "".join(f"<td>{'-' if c is None else html.escape(str(c))}</td>" for c in cells) + "</tr>")
    out.append("</table>")
    return "\n".join(out)


def write_all(ranked: list[Result], trial: Trial, out_dir: Path) -> Path:
    """tune.json, best.toml, tune.png and report.html; returns the HTML's path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    data = tune_json(ranked, trial)
    (out_dir / "tune.json").write_text(json.dumps(data, indent=2), encoding="utf-8")
    (out_dir / "best.toml").write_text(data["best"]["config_toml"], encoding="utf-8")
    image = _plot(ranked, out_dir / "tune.png")
    mode = "virtual time (the sim's scheduler and cost model)" if trial.virtual else f"real time ({trial.engine})"
    body = [
        "<h1>zerogap tune</h1>",
        f"<p>{len(ranked)} candidates in {html.escape(mode)}, steps {list(trial.steps)}, ranked by goodput "
        f"under TTFT &le; {trial.slo_ttft_ms:g} ms and TPOT &le; {trial.slo_tpot_ms:g} ms, then output TPS.</p>",
        f"<p>Best: <b>{html.escape(ranked[0].candidate.label)}</b>. The config.toml lines to paste:</p>",
        f"<pre>{html.escape(data['best']['config_toml'])}</pre>",
        image_html(image.name, "TPS against concurrency per candidate"),
        *[
            f"<p>{html.escape(label)} measured the same as {html.escape(first)}: its curves lie on the other's "
            "(drawn dashed over them, so both show).</p>"
            for label, first in repeated_curves(ranked)
        ],
        _rows(ranked),
    ]
    out = out_dir / "report.html"
    out.write_text(html_page("zerogap tune", body, STYLE), encoding="utf-8")
    return out
