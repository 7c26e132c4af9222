"""Try engine settings: start the pool with each combination of the --grid values, load-test
it in steps, stop it; rank by goodput under the SLOs, then output TPS, and say why each
one's TPS stops growing.

`zerogap tune [--config F] [--engine sim|vllm] --grid NAME=V1,V2 ... [--steps 32,128,256]
[--step-seconds S] [--slo ttft_ms=..,tpot_ms=..] [--virtual] [--out DIR]`."""

from __future__ import annotations

import argparse
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from common.argtypes import concurrency_list, positive_float, positive_int, slo_targets
from common.config import ConfigError, load_config
from common.config.model import Config
from zerogap.interrupts import stop_on_signals
from zerogap.tune.estimate import estimate
from zerogap.tune.grid import Candidate, candidates, parse_axis
from zerogap.tune.rank import Result, rank
from zerogap.tune.render import number, table, write_all
from zerogap.tune.runner import run_real
from zerogap.tune.toml_text import paste_lines
from zerogap.tune.trial import Trial
from zerogap.tune.virtual import run_virtual

DEFAULT_SLO = {"ttft_ms": 2000.0, "tpot_ms": 100.0}  # the load test's own defaults (settings.json slo)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="zerogap tune", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=None, help="config.toml (default ./config.toml if present)")
    parser.add_argument("--engine", choices=["sim", "vllm"], default="vllm", help="vllm (default) or sim (no GPU)")
    parser.add_argument(
        "--grid", action="append", required=True, metavar="NAME=V1,V2", help="a [scheduler]/[token_interval]/"
        "[engine]/[sim] field and the values to try (repeat for more fields; every combination runs)",
    )  # fmt: skip
    parser.add_argument("--steps", type=concurrency_list, default=[32, 128, 256], help="concurrencies (32,128,256)")
    parser.add_argument("--step-seconds", type=positive_float, default=60.0, help="hold each step (default 60)")
    parser.add_argument("--measure-seconds", type=positive_float, default=None, help="measure its last N s (2/3)")
    parser.add_argument("--warmup-seconds", type=float, default=5.0, help="warm-up at the first step (default 5)")
    parser.add_argument("--slo", type=slo_targets, default={}, help="ttft_ms=N,tpot_ms=N (default 2000 and 100)")
    parser.add_argument("--input-tokens", type=positive_int, default=128, help="prompt tokens (default 128)")
    parser.add_argument("--output-tokens", type=positive_int, default=64, help="output tokens (default 64)")
    parser.add_argument("--virtual", action="store_true", help="sim only: every candidate in virtual time")
    parser.add_argument("--out", type=Path, default=None, help="folder (default runs/tune-<UTC time>)")
    return parser


def _config(path: Path | None) -> Config:
    if path is None and not Path("config.toml").is_file():
        return Config()
    return load_config(path or Path("config.toml"), strict_env=False)  # [server].api_key is the gateway's


def _trial(args: argparse.Namespace) -> Trial:
    slo = {**DEFAULT_SLO, **args.slo}
    measure = args.measure_seconds or args.step_seconds * 2 / 3
    if measure > args.step_seconds:
        raise ConfigError(f"--measure-seconds {measure:g} is longer than --step-seconds {args.step_seconds:g}.")
    if args.virtual and args.engine != "sim":
        raise ConfigError("--virtual runs the simulated engine's model: add --engine sim.")
    return Trial(
        args.engine, tuple(args.steps), args.step_seconds, measure, max(0.0, args.warmup_seconds),
        args.input_tokens, args.output_tokens, slo["ttft_ms"], slo["tpot_ms"], args.virtual,
    )  # fmt: skip


def _run_all(found: list[Candidate], trial: Trial, out_dir: Path) -> list[Result]:
    results = []
    for i, candidate in enumerate(found, 1):
        print(f"zerogap tune [{i}/{len(found)}] {candidate.label}: running", flush=True)
        if trial.virtual:
            result = run_virtual(candidate, trial)
        else:
            result = run_real(candidate, trial, out_dir, f"candidate{i}")
        j = result.as_json()
        goodput, tps = number(j["goodput_rps"], ".2f"), number(j["output_tps"], ",.0f")  # as the table prints them
        print(
            f"zerogap tune [{i}/{len(found)}] {candidate.label}: goodput {goodput} req/s, output {tps} tok/s "
            f"at {number(j['best_concurrency'], 'g')}, limit {j['limit']} ({result.elapsed_s:.1f} s)",
            flush=True,
        )
        results.append(result)
    return results


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        trial = _trial(args)
        found = candidates(_config(args.config), [parse_axis(item) for item in args.grid])
    except ConfigError as exc:
        print(f"zerogap tune: {exc}", file=sys.stderr)
        return 2
    out_dir: Path = (args.out or Path("runs") / datetime.now(UTC).strftime("tune-%Y%m%dT%H%M%SZ")).resolve()
    mode = "virtual time" if trial.virtual else f"real time on {trial.engine}"
    expected = estimate(trial, [candidate.config for candidate in found])
    print(
        f"zerogap tune: {len(found)} candidates in {mode}, steps {list(trial.steps)} x {trial.step_s:g} s; "
        f"{expected.describe(trial.virtual)}; output in {out_dir}",
        flush=True,
    )
    stop_on_signals()  # Ctrl-C and SIGTERM stop the pool it started
    started = time.monotonic()
    try:
        results = _run_all(found, trial, out_dir)
    except KeyboardInterrupt:
        print("\nzerogap tune: interrupted; the pool it started is stopped", file=sys.stderr)
        return 130
    except (RuntimeError, ConfigError) as exc:
        print(f"zerogap tune: {exc}", file=sys.stderr)
        return 1
    ranked = rank(results)
    page = write_all(ranked, trial, out_dir)
    print("\n" + table(ranked))
    print(
        f"\nbest: {ranked[0].candidate.label}; paste into config.toml:\n\n{paste_lines(ranked[0].candidate.settings)}"
    )
    took_s = time.monotonic() - started
    print(
        f"zerogap tune: {took_s:.1f} s (estimated {expected.total_s:.0f} s); {out_dir / 'tune.json'}, report at {page}"
    )
    return 0
