"""The root of config.toml and what is derived from it (the gateway's pool)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, PrivateAttr, field_validator

from common.config.base import Section
from common.config.engine import EngineSection, SchedulerSection, TokenIntervalSection
from common.config.gateway import BackendEntry, GatewaySection, ServerSection
from common.config.observability import ObservabilitySection, check_request_log
from common.config.sim import SimSection


class LoggingSection(Section):
    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["text", "json"] = "text"
    access_log: bool = False
    log_tps: bool = Field(False, description="every log_interval_s: each replica's / the gateway's output tok/s")
    log_gpu_util: bool = Field(False, description="with it, each replica's GPU utilization (NVML; the sim's model)")
    log_interval_s: float = Field(10.0, gt=0, description="how often log_tps / log_gpu_util lines are printed")
    request_log: str = Field("off", description='one JSON line per request: "off", "stdout" or a file path')
    request_log_max_mb: float = Field(100.0, gt=0, description="a request log file is rotated past this size")
    request_log_keep: int = Field(5, ge=1, le=1000, description="rotated request log files kept (FILE.1 ...)")

    _request_log = field_validator("request_log")(check_request_log)


class Config(Section):
    server: ServerSection = Field(default_factory=ServerSection)
    gateway: GatewaySection = Field(default_factory=GatewaySection)
    backends: list[BackendEntry] = Field(default_factory=list)
    engine: EngineSection = Field(default_factory=EngineSection)
    scheduler: SchedulerSection = Field(default_factory=SchedulerSection)
    token_interval: TokenIntervalSection = Field(default_factory=TokenIntervalSection)
    sim: SimSection = Field(default_factory=SimSection)
    logging: LoggingSection = Field(default_factory=LoggingSection)
    observability: ObservabilitySection = Field(default_factory=ObservabilitySection)

    _source: str = PrivateAttr("config.toml")
    _base_dir: Path = PrivateAttr(default_factory=Path.cwd)

    @property
    def source(self) -> str:
        return self._source

    @source.setter
    def source(self, value: str) -> None:
        self._source = value

    @property
    def base_dir(self) -> Path:
        return self._base_dir

    @base_dir.setter
    def base_dir(self, value: Path) -> None:
        self._base_dir = value

    def resolve_path(self, value: str) -> Path:
        """A path from the file, relative to the file's folder."""
        path = Path(value).expanduser()
        return path if path.is_absolute() else self.base_dir / path

    def engine_replicas(self) -> list[BackendEntry]:
        """The backends `zerogap backends up` starts: replica i listens on base_port + i."""
        name = self.engine.client_model_name() or "model"
        return [
            BackendEntry(
                name=f"replica{i}",
                url=f"http://{self.engine.host}:{self.engine.base_port + i}",
                model=name,
            )
            for i in range(self.engine.replicas)
        ]

    def pool(self) -> list[BackendEntry]:
        """The gateway's pool: the [[backends]] listed, else the engine's replicas."""
        return list(self.backends) if self.backends else self.engine_replicas()
