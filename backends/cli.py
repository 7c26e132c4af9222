"""`zerogap backends up [--config config.toml] [--engine vllm|sim] [--log-dir DIR]`:
start the replicas [engine] describes, supervise them, stop them all on Ctrl-C."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from backends.errors import LaunchError
from backends.rate_log import RateLogger
from backends.sim_pool import sim_pool
from backends.supervisor import Supervisor, Timing
from backends.vllm.launcher import vllm_pool
from common.config import ConfigError, load_config


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="zerogap backends",
        description="Start the engine pool that config.toml's [engine] describes (replicas on ports from "
        "[engine].base_port up); the gateway reads the same file.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="up")
    up = sub.add_parser("up", help="start the replicas and supervise them until Ctrl-C / SIGTERM")
    up.add_argument("--config", default="config.toml", type=Path, help="config file (default ./config.toml)")
    up.add_argument("--engine", choices=["vllm", "sim"], default="vllm", help="vllm (default) or sim (no GPU needed)")
    up.add_argument("--log-dir", type=Path, help="also write each replica's output to DIR/replicaN.log")
    return parser


def up(config_path: Path, engine: str, log_dir: Path | None) -> int:
    try:
        config = load_config(config_path, strict_env=False)  # [server].api_key is the gateway's
        if engine == "sim":
            specs, hooks = sim_pool(config, config_path, log_dir)
        else:
            specs, hooks = vllm_pool(config, log_dir)
    except (ConfigError, LaunchError) as exc:
        print(f"zerogap backends: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"zerogap backends: {exc.filename or ''}: {exc.strerror}. Check --log-dir.", file=sys.stderr)
        return 2
    e, logs = config.engine, config.logging
    timing = Timing(e.startup_timeout_s, e.restart_backoff_max_s, e.stop_timeout_s)
    supervisor = Supervisor(specs, hooks, timing)
    if not (logs.log_tps or logs.log_gpu_util):
        return supervisor.run()
    rates = RateLogger(supervisor.children, supervisor.say, logs.log_interval_s, logs.log_tps, logs.log_gpu_util,
                       sim=engine == "sim")  # fmt: skip
    rates.start()
    try:
        return supervisor.run()
    finally:
        rates.stop()


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        return up(args.config, args.engine, args.log_dir)
    except KeyboardInterrupt:  # Ctrl-C before the supervisor took over: nothing was started yet
        print("zerogap backends: interrupted", file=sys.stderr)
        return 130
