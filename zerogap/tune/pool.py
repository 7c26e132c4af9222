"""One candidate's pool, under the backends' supervisor in a background thread: its
engines as `zerogap backends up` starts them (sims or vLLM replicas), plus a gateway in
front when there are several replicas. Stopped as a whole, Ctrl-C included."""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from backends.sim_pool import sim_pool
from backends.supervisor import ChildSpec, Hooks, Supervisor, Timing
from backends.supervisor_thread import SupervisorThread
from backends.vllm.launcher import vllm_pool
from common.commands import zerogap_command
from common.config.model import Config
from common.net import free_port
from zerogap.tune.toml_text import sections_text

ENGINE_SECTIONS = ("engine", "scheduler", "token_interval", "sim")
HOST = "127.0.0.1"


def candidate_config(config: Config, base_port: int, gateway_port: int, key: str) -> str:
    """The engine sections as tuned, on free ports; [server] only for the gateway in front."""
    dump = config.model_dump(exclude_unset=True)  # vLLM gets a flag for each field the file sets, only those
    dump["engine"] = {**dump.get("engine", {}), "base_port": base_port, "host": HOST}
    if config.engine.model and not Path(config.engine.model).is_absolute():
        resolved = config.resolve_path(config.engine.model)
        if resolved.exists():  # a local model folder stays found from the tune's own folder
            dump["engine"]["model"] = str(resolved)
    server = {"host": HOST, "port": gateway_port, "api_key": key, "base_url": f"http://{HOST}:{gateway_port}"}
    sections = {"server": server, **{name: dump.get(name, {}) for name in ENGINE_SECTIONS}}
    sections["gateway"] = {"health_interval_s": 1}
    return sections_text(sections)


@dataclass
class CandidatePool:
    config: Config
    engine: str
    folder: Path
    key: str = field(default_factory=lambda: "sk-tune-" + secrets.token_urlsafe(24))
    base_port: int = 0
    gateway_port: int = 0
    _running: SupervisorThread | None = None
    _out: IO[str] | None = None

    @property
    def replicas(self) -> int:
        return self.config.engine.replicas

    @property
    def base_url(self) -> str:
        """Where the load test sends: the one replica, or the gateway in front of several."""
        port = self.base_port if self.replicas == 1 else self.gateway_port
        return f"http://{HOST}:{port}"

    @property
    def metrics_urls(self) -> list[str]:
        return [f"http://{HOST}:{self.base_port + i}/metrics" for i in range(self.replicas)]

    def start(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.base_port, self.gateway_port = free_port(), free_port()
        path = self.folder / "config.toml"
        path.write_text(candidate_config(self.config, self.base_port, self.gateway_port, self.key), "utf-8")
        from common.config import load_config

        config = load_config(path, strict_env=False)
        self._out = (self.folder / "supervisor.log").open("a", encoding="utf-8")
        logs = self.folder / "logs"
        if self.engine == "sim":
            specs, hooks = sim_pool(config, path, logs, out=self._out)
        else:
            specs, hooks = vllm_pool(config, logs, out=self._out)
        if self.replicas > 1:
            argv = zerogap_command("gateway", "--config", str(path))
            specs.append(
                ChildSpec("gateway", argv, HOST, self.gateway_port, dict(os.environ), "/health", logs / "gateway.log")
            )
        self._run(specs, hooks, config)

    def _run(self, specs: list[ChildSpec], hooks: Hooks, config: Config) -> None:
        e = config.engine
        timing = Timing(e.startup_timeout_s, e.restart_backoff_max_s, e.stop_timeout_s)
        self._running = SupervisorThread(Supervisor(specs, hooks, timing, out=self._out), "tune-pool")
        self._running.start(f"the pool did not come up; see {self.folder / 'supervisor.log'}")

    def stop(self) -> None:
        if self._running is not None:
            self._running.stop()
        if self._out is not None:
            self._out.close()
