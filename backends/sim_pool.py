"""`zerogap backends up --engine sim`: one simulated engine per [engine] replica, for
machines with no GPU. Each runs `zerogap sim --config C --port P --model M`."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import IO

from backends.pool import check_ports, pool_summary, replica_log
from backends.sim.settings import settings_from_config
from backends.supervisor import Child, ChildSpec, Hooks
from common.commands import zerogap_command
from common.config import Config


def sim_specs(config: Config, config_path: Path, log_dir: Path | None) -> list[ChildSpec]:
    engine = config.engine
    check_ports(config)
    model = engine.client_model_name() or "model"
    env = dict(os.environ)
    specs = []
    for i in range(engine.replicas):
        port = engine.base_port + i
        argv = zerogap_command("sim", "--config", str(config_path.resolve()))
        argv += ["--host", engine.host, "--port", str(port), "--model", model]
        name = f"replica{i}"
        specs.append(ChildSpec(name, argv, engine.host, port, env, "/health", replica_log(log_dir, name)))
    return specs


def sim_pool(
    config: Config, config_path: Path, log_dir: Path | None, out: IO[str] | None = None
) -> tuple[list[ChildSpec], Hooks]:
    stream = out or sys.stdout

    def diagnose(child: Child, code: int | None) -> str:
        """The sim's own message (it says what to do), if it printed one."""
        return next((line for line in reversed(child.tail) if line.startswith("zerogap sim:")), "")

    def on_ready(children: list[Child]) -> str:
        overlap = str(config.token_interval.async_scheduling).lower()
        mode = settings_from_config(config).mode
        return (
            f"zerogap backends: simulated engines in mode {mode}: [token_interval] overlap_token_interval = "
            f"async_scheduling = {overlap}\n{pool_summary(config, children)}"
        )

    stream.write(f"zerogap backends: starting {config.engine.replicas} simulated engine(s)\n")
    engine = config.engine
    if engine.tensor_parallel_size * engine.pipeline_parallel_size > 1:
        stream.write(
            f"zerogap backends: [engine].tensor_parallel_size = {engine.tensor_parallel_size}, pipeline_parallel_size "
            f"= {engine.pipeline_parallel_size}: the sim models one engine per replica (its [sim] cost model), "
            "whatever the GPUs it would span\n"
        )
    return sim_specs(config, config_path, log_dir), Hooks(diagnose=diagnose, on_ready=on_ready)
