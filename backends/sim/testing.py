"""Start a real `zerogap sim` subprocess on a free port, for tests and benches.

    with run_sim_process("--time-scale", "4", model="m") as sim:
        requests to sim.url ...

It binds a free loopback port, waits until /health answers, and stops the process
(SIGTERM, then SIGKILL) on exit. The config file is none unless config= is given, so
a developer's ./config.toml does not leak into tests.
"""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from common.commands import zerogap_command
from common.net import free_port, wait_http_ok
from common.process_group import stop_process

EMPTY_CONFIG = "# empty: every setting has its default\n"


@dataclass(frozen=True)
class SimProcess:
    proc: subprocess.Popen[bytes]
    port: int
    model: str
    log: Path  # the process's stderr (gone after the block ends)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def wait_healthy(url: str, proc: subprocess.Popen[bytes], log: Path, timeout_s: float = 30.0) -> None:
    try:
        wait_http_ok(f"{url}/health", timeout_s, proc, what="zerogap sim")
    except RuntimeError:
        err = log.read_text(errors="replace").strip()
        raise RuntimeError(f"zerogap sim exited with {proc.returncode}: {err}") from None


@contextmanager
def run_sim_process(
    *args: str,
    model: str = "sim-model",
    port: int | None = None,
    config: str | Path | None = None,
    timeout_s: float = 120.0,  # a process start: far above the few seconds it takes, for a busy machine
) -> Iterator[SimProcess]:
    """Run `python -m zerogap sim --config C --port P --model M ARGS...` until the block ends."""
    port = port or free_port()
    with tempfile.TemporaryDirectory(prefix="zerogap-sim-") as tmp:
        if config is None:
            config = Path(tmp) / "config.toml"
            config.write_text(EMPTY_CONFIG)
        cmd = zerogap_command("sim", "--config", str(config), "--port", str(port), "--model", model)
        log = Path(tmp) / "sim.log"
        with log.open("wb") as log_file:
            proc = subprocess.Popen([*cmd, *args], stdout=subprocess.DEVNULL, stderr=log_file)
        try:
            sim = SimProcess(proc, port, model, log)
            wait_healthy(sim.url, proc, log, timeout_s)
            yield sim
        finally:
            stop_process(proc)
