"""`zerogap sim calibrate RUN_DIR [RUN_DIR ...] --config CONFIG --out FILE`.

Reads stepped load-test runs against an engine (vLLM or a sim) and the engine's
config.toml (its scheduling settings are known; its cost model is not), fits the [sim]
cost model to them, prints the fit step by step, and writes FILE: CONFIG's text with the
fitted [sim] section, for `zerogap sim plan`, `zerogap backends up --engine sim` and
`zerogap tune --engine sim --virtual`.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from backends.sim.calibrate.fit import Calibration, calibrate
from backends.sim.calibrate.runs import CalibrationError, engine_ttft_ms, gauges_read, read_runs
from backends.sim.calibrate.sim_toml import replace_sim
from backends.sim.settings import settings_from_config
from common.config import ConfigError, load_config

WRITTEN = (  # the [sim] fields FILE sets: the cost model and the KV cache
    "forward_fixed_ms", "forward_per_seq_ms", "forward_per_prefill_token_ms", "interval_fixed_ms",
    "interval_per_seq_ms", "interval_schedule_per_seq_ms", "interval_detokenize_per_seq_ms", "async_overhead_ms",
    "client_gap_ms", "frontend_per_request_ms", "frontend_per_token_ms", "kv_cache_blocks", "block_size",
)  # fmt: skip


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="zerogap sim calibrate",
        description="Fit the simulated engine's [sim] cost model to stepped load-test runs against a real engine "
        "(report.json + timeline.csv of `locust -f loadtest/`) and write CONFIG with the fitted [sim] to --out.",
    )
    p.add_argument("run_dirs", nargs="+", type=Path, metavar="RUN_DIR", help="run folders (each has report.json)")
    p.add_argument("--config", type=Path, required=True, help="the engine's config.toml (its scheduling settings)")
    p.add_argument("--out", type=Path, required=True, help="the config.toml to write (CONFIG + the fitted [sim])")
    return p


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    try:
        config = load_config(args.config, strict_env=False)
        text = args.config.read_text(encoding="utf-8")
        runs = read_runs(args.run_dirs)
    except (ConfigError, CalibrationError, OSError) as exc:
        print(f"zerogap sim calibrate: {exc}", file=sys.stderr)
        return 2
    settings = settings_from_config(config)
    replicas = config.engine.replicas
    result = calibrate(settings, runs.observations, replicas)
    print(report_text(result, len(args.run_dirs), replicas, runs.notes))
    values = {name: getattr(result.settings.cost, name) for name in WRITTEN}
    comment = f"fitted by `zerogap sim calibrate` from {', '.join(d.name for d in args.run_dirs)}"
    args.out.write_text(replace_sim(text, values, comment), encoding="utf-8")
    try:
        load_config(args.out, strict_env=False)
    except ConfigError as exc:  # a zerogap bug: say so rather than leave a file that does not load
        print(f"zerogap sim calibrate: {args.out} does not load back ({exc}); please report this", file=sys.stderr)
        return 1
    print(f"wrote {args.out}: CONFIG with the fitted [sim]. Next: zerogap sim plan --config {args.out} ...")
    return 0


def _pct(model: float | None, measured: float | None) -> str:
    if model is None or measured is None or measured == 0:
        return "-"
    return f"{100.0 * (model / measured - 1.0):+.1f}%"


def _pair(measured: float | None, model: float | None, spec: str) -> str:
    def one(v: float | None) -> str:
        return "-" if v is None else format(v, spec)

    return f"{one(measured)} -> {one(model)} ({_pct(model, measured)})"


MAX_SHOWN_LOG_ERROR = math.log(100.0)  # beyond a factor of 100 the figure says nothing more


def _spread(log_error: float) -> str:
    """A term's standard error (of its log) as a person reads it, flagged when over 10%."""
    if not math.isfinite(log_error):
        return "not seen by the data  (loosely pinned)"
    if log_error > MAX_SHOWN_LOG_ERROR:
        return "over a factor of 100: not pinned down by the data  (loosely pinned)"
    flag = "  (loosely pinned)" if log_error > math.log(1.1) else ""
    return f"+-{100 * (math.exp(log_error) - 1):.1f}%{flag}"


def report_text(result: Calibration, num_runs: int, replicas: int, run_notes: list[str]) -> str:
    s = result.settings
    lines = [
        f"zerogap sim calibrate: {len(result.steps)} step(s) from {num_runs} run(s); mode {s.mode}, "
        f"{replicas} replica(s), time_scale {s.time_scale:g}; {result.num_evaluations} virtual evaluations "
        f"in {result.elapsed_s:.1f} s",
        "fitted [sim] terms (standard error; over 10%: loosely pinned down):",
    ]
    for term, error in zip(result.terms, result.log_errors, strict=True):
        value = ", ".join(f"{name} = {getattr(s.cost, name):.4g}" for name in term.fields)
        lines.append(f"  {value}  {_spread(error)}")
    lines.append("kept or assumed:")
    lines += [f"  - {note}" for note in result.notes + run_notes]
    lines.append("per step, measured -> modelled (error):")
    head = f"  {'step':<14} {'users':>5} {'prompt':>6}  {'output TPS':<24} {'TPOT p50 ms':<24} {'TTFT p50 ms *':<26}"
    head += " GPU busy"
    lines.append(head)
    worst: dict[str, float] = {}
    read = gauges_read([fit.observation for fit in result.steps])
    for fit in result.steps:
        o, m = fit.observation, fit.model
        ttft = engine_ttft_ms(o, o.ttft_p50_ms, read)
        busy = "-" if o.gpu_busy is None else f"{o.gpu_busy:.1%} -> {m.gpu_busy:.1%}"
        lines.append(
            f"  {o.label:<14} {o.users:>5} {o.prompt_tokens:>6}  {_pair(o.output_tps, m.output_tps, '.0f'):<24} "
            f"{_pair(o.tpot_p50_ms, m.tpot_p50_ms, '.2f'):<24} {_pair(ttft, m.engine_ttft_p50_ms, '.1f'):<26} {busy}"
            + ("" if o.steady else "  (TPS moved within the window: weighted half)")
        )
        for name, a, b in (("TPS", m.output_tps, o.output_tps), ("TPOT", m.tpot_p50_ms, o.tpot_p50_ms),
                           ("TTFT", m.engine_ttft_p50_ms, ttft)):  # fmt: skip
            if a is not None and b:
                worst[name] = max(worst.get(name, 0.0), abs(a / b - 1.0))
    lines.append("  * the engine's part: the client's TTFT less each request's time outside the engine; - left out")
    lines.append("largest error: " + ", ".join(f"{k} {100 * v:.1f}%" for k, v in worst.items()))
    return "\n".join(lines)
