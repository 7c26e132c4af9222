"""The vLLM pool: one ChildSpec per replica (command, environment, GPUs, port) and the
hooks that read each replica's start-up output into the "in force" table."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import IO

from backends.pool import check_ports, pool_summary, replica_log
from backends.supervisor import Child, ChildSpec, Hooks
from backends.vllm.command import asked, resolve_model, vllm_argv, vllm_env
from backends.vllm.diagnose import diagnose
from backends.vllm.gpus import split_gpus, visible_gpus
from backends.vllm.install import VllmInstall, detect_vllm, vllm_python
from backends.vllm.startup_report import StartupReport
from backends.vllm.table import build_rows, render
from common.config import Config


def vllm_specs(config: Config, install: VllmInstall, env: Mapping[str, str], log_dir: Path | None) -> list[ChildSpec]:
    engine = config.engine
    check_ports(config)
    model = resolve_model(config)
    groups = split_gpus(visible_gpus(env), engine.replicas, engine.tensor_parallel_size * engine.pipeline_parallel_size)
    specs = []
    for i, gpus in enumerate(groups):
        port = engine.base_port + i
        child_env = {**env, **vllm_env(config)}
        if gpus:
            child_env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
        name = f"replica{i}"
        argv = vllm_argv(config, install.python, model, port)
        specs.append(ChildSpec(name, argv, engine.host, port, child_env, "/health", replica_log(log_dir, name)))
    return specs


class VllmHooks:
    """Per replica: a StartupReport fed from its output; the table once all are up."""

    def __init__(self, config: Config, install: VllmInstall, out: IO[str]) -> None:
        self.config = config
        self.install = install
        self.out = out
        self.reports: dict[str, StartupReport] = {}

    def on_start(self, child: Child) -> None:
        self.reports[child.spec.name] = StartupReport()

    def on_line(self, child: Child, line: str) -> None:
        self.reports[child.spec.name].feed(line)

    def diagnose(self, child: Child, code: int | None) -> str:
        return diagnose(child.tail, self.config)

    def table(self, child: Child) -> str:
        report = self.reports[child.spec.name]
        version = report.vllm_version or self.install.version
        device = report.reported.get("device", "?")
        engine = report.engine_version or "?"
        title = f"{child.spec.name} at {child.spec.url}: vLLM {version}, {engine} engine, {device}"
        return render(title, build_rows(asked(self.config), report), report)

    def on_ready(self, children: list[Child]) -> str:
        tables = "\n\n".join(self.table(child) for child in children)
        return f"\n{tables}\n\n{pool_summary(self.config, children)}"

    def hooks(self) -> Hooks:
        return Hooks(on_line=self.on_line, diagnose=self.diagnose, on_ready=self.on_ready, on_start=self.on_start)


def vllm_pool(config: Config, log_dir: Path | None, out: IO[str] | None = None) -> tuple[list[ChildSpec], Hooks]:
    """Raises LaunchError (what to do) when the pool cannot start as configured."""
    stream = out or sys.stdout
    env = dict(os.environ)
    check_ports(config)
    engine = config.engine
    split_gpus(visible_gpus(env), engine.replicas, engine.tensor_parallel_size * engine.pipeline_parallel_size)
    resolve_model(config)  # the file's mistakes first, before asking the interpreter
    install = detect_vllm(vllm_python(config, env))
    stream.write(
        f"zerogap backends: vLLM {install.version} ({install.distribution}) in {install.python}; "
        f"starting {config.engine.replicas} replica(s)\n"
    )
    specs = vllm_specs(config, install, env, log_dir)
    return specs, VllmHooks(config, install, stream).hooks()
