"""The PNGs of a run's report: figures against load, and the timeline with the steps."""

from __future__ import annotations

from pathlib import Path
from typing import Any

DPI = 110


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend, imported on first use: reading a report costs no plotting library."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def load_of(step: dict[str, Any]) -> float:
    return float(step.get("concurrency", step.get("request_rate", 0.0)))


def load_label(steps: list[dict[str, Any]]) -> str:
    return "request rate (req/s)" if steps and "request_rate" in steps[0] else "concurrency (users)"


def _series(steps: list[dict[str, Any]], key: str, pct: str) -> list[float]:
    return [float("nan") if not s[key] or s[key][pct] is None else s[key][pct] for s in steps]


def _number(value: float | None) -> float:
    return float("nan") if value is None else float(value)


def plot_vs_load(report: dict[str, Any], path: Path) -> Path:
    plt = pyplot()
    steps = report["steps"]
    loads = [load_of(s) for s in steps]
    fig, axes = plt.subplots(2, 2, figsize=(12, 8), dpi=DPI)
    tps, gpu, ttft, tpot = axes[0][0], axes[0][1], axes[1][0], axes[1][1]
    tps.plot(loads, [_number(s["output_tps"]) for s in steps], "o-", label="output tok/s")
    tps.plot(loads, [_number(s["total_tps"]) for s in steps], "s--", label="total tok/s (prompt + output)")
    invalid = [(load_of(s), _number(s["output_tps"])) for s in steps if not s["valid"]]
    if invalid:
        tps.plot(*zip(*invalid, strict=True), "rx", markersize=12, label="invalid: load generator saturated")
    knee = report.get("knee")
    for ax in (tps, gpu, ttft, tpot):
        if knee:
            ax.axvline(knee["load"], color="grey", linestyle=":", label="knee")
        ax.set_xlabel(load_label(steps))
        ax.set_xticks(loads)
        ax.grid(alpha=0.3)
    tps.set_title("Throughput")
    tps.set_ylabel("tokens/s")
    means = [s["gpu_util"]["mean"] if s["gpu_util"] else float("nan") for s in steps]
    mins = [s["gpu_util"]["min"] if s["gpu_util"] else float("nan") for s in steps]
    gpu.plot(loads, means, "o-", color="tab:green", label="mean")
    gpu.plot(loads, mins, "v--", color="tab:olive", label="min")
    gpu.set_ylim(0, 105)
    gpu.set_title("GPU utilization")
    reasons = [s["gpu_util_reason"] for s in steps if s["gpu_util"] is None and s.get("gpu_util_reason")]
    if reasons:
        gpu.text(0.5, 0.5, f"not available:\n{reasons[0]}", transform=gpu.transAxes, ha="center", wrap=True)
    gpu.set_ylabel("%")
    for ax, key, title in ((ttft, "ttft_ms", "Time to first token"), (tpot, "tpot_ms", "Time per output token")):
        for pct, style in (("p50", "o-"), ("p90", "^--"), ("p99", "v:")):
            ax.plot(loads, _series(steps, key, pct), style, label=pct)
        ax.set_title(title)
        ax.set_ylabel("ms")
    tpot.plot(loads, _series(steps, "itl_ms", "p50"), "d-.", label="ITL p50")
    for ax in (tps, gpu, ttft, tpot):
        ax.legend(fontsize=8)
        ax.set_ylim(bottom=0)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def _column(rows: list[dict[str, Any]], key: str) -> list[float]:
    return [float("nan") if row.get(key) is None else float(row[key]) for row in rows]


def _draw_steps(ax: Any, report: dict[str, Any]) -> None:
    for step in report["steps"]:
        ax.axvline(step["start_s"], color="grey", linestyle="--", linewidth=0.8)
        ax.axvspan(step["end_s"] - step["duration_s"], step["end_s"], color="tab:blue", alpha=0.06)


def plot_timeline(report: dict[str, Any], rows: list[dict[str, Any]], path: Path) -> Path:
    plt = pyplot()
    times = _column(rows, "time_s")
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(12, 8), dpi=DPI, sharex=True)
    top.plot(times, _column(rows, "output_tps"), color="tab:blue", label="output tok/s")
    top.set_ylabel("output tokens/s", color="tab:blue")
    gpu_axis = top.twinx()
    gpu_axis.plot(times, _column(rows, "gpu_util"), color="tab:green", label="GPU util %")
    gpu_axis.set_ylabel("GPU utilization %", color="tab:green")
    gpu_axis.set_ylim(0, 105)
    top.set_title("TPS and GPU utilization over time (dashed: step starts; shaded: measured windows)")
    _draw_steps(top, report)
    for step in report["steps"]:
        top.annotate(
            f"{load_of(step):g}",
            (step["start_s"], 1.0),
            xycoords=("data", "axes fraction"),
            fontsize=8,
            va="top",
        )
    bottom.plot(times, _column(rows, "users"), label="users")
    bottom.plot(times, _column(rows, "backend_running"), label="backend running")
    bottom.plot(times, _column(rows, "backend_waiting"), label="backend waiting")
    bottom.set_ylabel("requests")
    cpu_axis = bottom.twinx()
    cpu_axis.plot(times, _column(rows, "loadgen_cpu_percent"), color="tab:red", alpha=0.6, label="load-gen CPU %")
    cpu_axis.set_ylabel("load-generator CPU %", color="tab:red")
    cpu_axis.set_ylim(0, 105)
    _draw_steps(bottom, report)
    bottom.set_xlabel("time since start (s)")
    bottom.legend(loc="upper left", fontsize=8)
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
