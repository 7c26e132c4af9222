"""What `zerogap demo` runs: two simulated pools and one gateway under the backends'
supervisor (own process groups, stopped as a whole), and the harness settings for each
pool."""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from backends.supervisor import ChildSpec, Hooks, Supervisor, Timing
from backends.supervisor_thread import SupervisorThread
from common.commands import zerogap_command

KEY_ENV = "ZEROGAP_DEMO_KEY"
HOST = "127.0.0.1"
READY_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Pool:
    name: str
    scheduling: str
    slot_reuse: bool
    blurb: str
    port: int = 0

    def sim_argv(self, time_scale: float, config: Path) -> list[str]:
        """The demo's own config (never a config.toml that happens to be in the working folder)."""
        reuse = "--slot-reuse" if self.slot_reuse else "--no-slot-reuse"
        argv = zerogap_command("sim", "--config", str(config), "--host", HOST)
        argv += ["--port", str(self.port), "--model", self.name, "--scheduling", self.scheduling, reuse]
        return [*argv, "--time-scale", f"{time_scale:g}"]


POOLS = (
    Pool("baseline", "sync", False, "synchronous scheduling, global reschedule every step"),
    Pool("zerogap", "async", True, "slot reuse + async scheduling"),
)


def gateway_config(pools: list[Pool], gateway_port: int, key: str, out_dir: Path) -> str:
    lines = [
        "[server]",
        f'host = "{HOST}"',
        f"port = {gateway_port}",
        f'api_key = "{key}"',
        f'base_url = "http://{HOST}:{gateway_port}/api"',
        "",
        "[gateway]",
        f'key_store = "{out_dir / "keys.db"}"',
        "health_interval_s = 1",
        "",
        "[sim]",
        "# the sims' busy and interval gauges average their last 2 s: a step's window, which",
        "# starts at least 2 s into the step, then reads nothing of the step before it",
        "metrics_window_s = 2.0",
    ]
    for pool in pools:
        lines += ["", "[[backends]]", f'name = "{pool.name}-sim"', f'url = "http://{HOST}:{pool.port}"']
        lines.append(f'model = "{pool.name}"')
    return "\n".join(lines) + "\n"


def harness_settings(pool: Pool, args: argparse.Namespace, gateway_port: int, out_dir: Path) -> str:
    """settings.json for one pool's stepped run, as JSON text."""
    steps: list[int] = args.steps
    settings = {
        "api": {"base_url": f"http://{HOST}:{gateway_port}/api", "api_key_env": KEY_ENV, "endpoint": "chat"},
        "load_test": {
            "concurrency": steps[0],
            "duration_seconds": args.step_seconds,
            "request_rate": 0,
            "warmup_seconds": args.warmup_seconds,
            "steps": steps,
            "step_duration_seconds": args.step_seconds,
            "measure_last_seconds": args.measure_seconds,
        },
        "workload": {
            "model": pool.name,
            "prompt_tokens": args.input_tokens,
            "max_output_tokens": args.output_tokens,
            "ignore_eos": True,
            "tokenize_url": f"http://{HOST}:{pool.port}/tokenize",
        },
        "metrics": {
            "sample_interval_ms": 1000,
            "gpu_util": {"source": "backend_metrics", "backend_metric": "zerogap_sim_gpu_busy_ratio"},
            "backend_metrics_urls": [f"http://{HOST}:{pool.port}/metrics"],
            "exporter_port": 0,
        },
        # Interactive SLOs (1 s to first token, 50 ms a token), stretched by the sims' time scale.
        "slo": {"ttft_ms": 1000 * args.time_scale, "tpot_ms": 50 * args.time_scale},
        "output": {"dir": str(out_dir), "run_name": pool.name},
    }
    return json.dumps(settings, indent=2)


@dataclass
class Stack:
    """The sims and the gateway, supervised in a background thread."""

    pools: list[Pool]
    time_scale: float
    out_dir: Path
    key: str
    gateway_port: int
    _running: SupervisorThread | None = None
    _log: IO[str] | None = None

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.gateway_port}/api"

    def _spec(self, name: str, argv: list[str], port: int) -> ChildSpec:
        return ChildSpec(name, argv, HOST, port, dict(os.environ), "/health", self.out_dir / "logs" / f"{name}.log")

    def start(self) -> None:
        logs = self.out_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        config = self.out_dir / "config.toml"
        config.write_text(gateway_config(self.pools, self.gateway_port, self.key, self.out_dir), encoding="utf-8")
        specs = [self._spec(f"sim-{p.name}", p.sim_argv(self.time_scale, config), p.port) for p in self.pools]
        gateway = zerogap_command("gateway", "--config", str(config))
        specs.append(self._spec("gateway", gateway, self.gateway_port))
        self._log = (logs / "supervisor.log").open("a", encoding="utf-8")
        timing = Timing(startup_timeout_s=READY_TIMEOUT_S, stop_timeout_s=10.0)
        self._running = SupervisorThread(Supervisor(specs, Hooks(), timing, out=self._log), "demo-supervisor")
        self._running.start(f"the demo's sims and gateway did not come up; see {logs}")

    def stop(self) -> None:
        if self._running is not None:
            self._running.stop()
        if self._log is not None:
            self._log.close()
