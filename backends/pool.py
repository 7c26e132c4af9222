"""What both engines' pools share: the ports they take, log files, the ready summary."""

from __future__ import annotations

from pathlib import Path

from backends.errors import LaunchError
from backends.supervisor import Child
from common.config import Config


def check_ports(config: Config) -> None:
    last = config.engine.base_port + config.engine.replicas - 1
    if last > 65535:
        raise LaunchError(
            f"{config.source}: [engine].base_port {config.engine.base_port} + {config.engine.replicas} replicas "
            "runs past port 65535. Lower [engine].base_port."
        )


def replica_log(log_dir: Path | None, name: str) -> Path | None:
    if log_dir is None:
        return None
    log_dir.mkdir(parents=True, exist_ok=True)
    return log_dir / f"{name}.log"


def pool_summary(config: Config, children: list[Child]) -> str:
    urls = ", ".join(f"{c.spec.name} {c.spec.url}" for c in children)
    model = config.engine.client_model_name()
    if config.backends:
        route = (
            f"Note: {config.source} lists [[backends]], so `zerogap gateway` routes to those, not to these "
            "replicas; remove them to route here."
        )
    else:
        route = f"`zerogap gateway --config {config.source}` routes to them (no [[backends]] needed)."
    return (
        f"zerogap backends: ready: {len(children)} replica(s) of {model!r}: {urls}\n"
        f"zerogap backends: {route} Ctrl-C stops them all."
    )
