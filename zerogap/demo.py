"""`zerogap demo`: the whole loop on one command, no GPU needed.

Two simulated pools behind one gateway, "baseline" (synchronous scheduling, no slot
reuse) and "zerogap" (slot reuse + async scheduling), each load-tested in steps with the
Locust harness through the gateway; then one report that sets them side by side.
Everything it starts runs under the backends' supervisor and is stopped on the way
out, Ctrl-C included.
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
from datetime import UTC, datetime
from pathlib import Path

from common.argtypes import concurrency_list, positive_float, positive_int
from common.net import free_port
from loadtest import ReportError, read_report, render_comparison, table
from zerogap.demo_stack import KEY_ENV, POOLS, Pool, Stack, harness_settings
from zerogap.interrupts import stop_on_signals
from zerogap.locust_run import run_locust


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="zerogap demo", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="run folder (default runs/demo-<UTC time>)")
    parser.add_argument(
        "--steps", type=concurrency_list, default=[32, 128, 256], help="concurrency steps (default 32,128,256)"
    )
    parser.add_argument("--step-seconds", type=positive_float, default=30.0, help="hold each step (default 30)")
    parser.add_argument(  # 15 s of lead: longer than a request at 256 streams (~10 s), see --output-tokens
        "--measure-seconds", type=positive_float, default=15.0, help="measure its last N s (default 15)"
    )
    parser.add_argument("--warmup-seconds", type=float, default=5.0, help="warm-up at the first step (default 5)")
    parser.add_argument("--time-scale", type=positive_float, default=4.0, help="sim time scale: 2 cores keep up (4)")
    parser.add_argument(
        "--input-tokens", type=positive_int, default=128, help="prompt tokens per request (default 128)"
    )
    parser.add_argument("--output-tokens", type=positive_int, default=32, help="output tokens per request (default 32)")
    return parser


def run_harness(pool: Pool, args: argparse.Namespace, stack: Stack, out_dir: Path) -> Path:
    """One stepped Locust run against one pool; returns its run folder."""
    settings = out_dir / f"settings-{pool.name}.json"
    settings.write_text(harness_settings(pool, args, stack.gateway_port, out_dir), encoding="utf-8")
    env = {**os.environ, KEY_ENV: stack.key}
    print(f"\n== {pool.name}: {pool.blurb} (steps {args.steps}, {args.step_seconds:g} s each) ==", flush=True)
    log_path = out_dir / "logs" / f"locust-{pool.name}.log"
    returncode = run_locust(settings, env, log_path)
    run_dir = out_dir / pool.name
    # Locust exits 1 when any request failed: the run still counts (its report says how many).
    if returncode not in (0, 1) or not (run_dir / "report.json").exists():
        raise RuntimeError(f"the load test against {pool.name} failed (exit {returncode}); see {log_path}")
    return run_dir


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    stop_on_signals()  # Ctrl-C and SIGTERM stop everything it started
    out_dir: Path = (args.out or Path("runs") / datetime.now(UTC).strftime("demo-%Y%m%dT%H%M%SZ")).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    pools = [Pool(p.name, p.scheduling, p.slot_reuse, p.blurb, free_port()) for p in POOLS]
    key = "sk-demo-" + secrets.token_urlsafe(24)
    stack = Stack(pools, args.time_scale, out_dir, key, free_port())
    print(
        f"zerogap demo: two simulated pools (time scale {args.time_scale:g}) behind one gateway; logs in "
        f"{out_dir / 'logs'}",
        flush=True,
    )
    try:
        stack.start()
        print(f"zerogap demo: gateway on {stack.base_url}; sims on ports {[p.port for p in pools]}", flush=True)
        run_dirs = [run_harness(pool, args, stack, out_dir) for pool in pools]
    except KeyboardInterrupt:
        print("\nzerogap demo: interrupted; stopping everything it started", file=sys.stderr)
        return 130
    except RuntimeError as exc:
        print(f"zerogap demo: {exc}", file=sys.stderr)
        return 1
    finally:
        stack.stop()
    return _summarize(pools, run_dirs, out_dir)


def _summarize(pools: list[Pool], run_dirs: list[Path], out_dir: Path) -> int:
    try:
        reports = [read_report(run_dir)[0] for run_dir in run_dirs]
        page = render_comparison(run_dirs, [p.name for p in pools], out_dir)
    except ReportError as exc:
        print(f"zerogap demo: {exc}", file=sys.stderr)
        return 1
    for pool, report in zip(pools, reports, strict=True):
        print(f"\n{pool.name} ({pool.blurb}):\n{table(report)}")
    print("\n" + _headline(pools, reports))
    print(f"\nzerogap demo: report at {page}")
    return 0


def _headline(pools: list[Pool], reports: list[dict[str, object]]) -> str:
    """TPS and GPU utilization of each pool at the top step, and the ratio."""
    lines = []
    tops = []
    for pool, report in zip(pools, reports, strict=True):
        steps = report["steps"]
        assert isinstance(steps, list)
        top = steps[-1]
        tops.append(top)
        gpu = top.get("gpu_util")
        gpu_text = f"{gpu['mean']:.0f}% GPU busy" if gpu else "GPU busy n/a"
        interval, cpu = top.get("token_interval_ms"), top.get("cpu_interval_ms")
        interval_text = ""
        if isinstance(interval, int | float):
            interval_text = f", token interval (GPU idle between forwards) {interval:.1f} ms"
        if isinstance(cpu, int | float):
            interval_text += f", CPU work per step {cpu:.1f} ms"
        lines.append(
            f"  {pool.name:>9} at {top.get('concurrency', 0):g} streams: {top['output_tps']:,.0f} output tok/s, "
            f"{gpu_text}{interval_text}"
        )
    if len(tops) == 2 and tops[0]["output_tps"]:
        lines.append(f"  {pools[1].name} / {pools[0].name} TPS: {tops[1]['output_tps'] / tops[0]['output_tps']:.2f}x")
    return "at the top step:\n" + "\n".join(lines)
