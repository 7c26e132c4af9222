"""`zerogap gateway --workers N`: N gateway processes on one port, kept alive by this supervisor.

Each worker is `zerogap gateway ... --reuse-port`: it binds the port itself with SO_REUSEPORT, so the
kernel spreads new connections evenly over the workers. The supervisor checks that the port is
free, starts the workers with PROMETHEUS_MULTIPROC_DIR set to a fresh temporary folder (GET /metrics
in any worker then shows the sum over all of them) and, without [gateway].redis_url, a file of
shared rate-limit buckets (gateway/tenants/limits/sqlite.py); it restarts a worker that dies, and on SIGINT
or SIGTERM sends SIGTERM to every worker (each drains: gateway/pool/drain.py), waits for them, and
removes the folder; a second signal is forwarded too (the workers then exit at once). The
supervising itself (process groups, restarts, signals, the grace before SIGKILL) is the shared
core's, common/supervisor.py.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
import tempfile

from common.commands import zerogap_command
from common.process_group import popen_in_group
from common.supervisor import ProcessSupervisor, RestartPolicy, Slot
from gateway.tenants.limits.sqlite import SHARED_LIMITS_ENV

log = logging.getLogger("zerogap.gateway.workers")

STOP_GRACE_S = 30.0  # beyond the workers' own drain timeout
QUICK_EXIT_S = 3.0  # a worker that dies this soon after its start counts as a failed start
MAX_FAILED_STARTS = 5


def reuse_port_socket(host: str, port: int) -> socket.socket:
    """A socket bound to host:port with SO_REUSEPORT (not yet listening)."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[
        0
    ]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(address)
    except OSError:
        sock.close()
        raise
    return sock


class Supervisor(ProcessSupervisor[Slot]):
    def __init__(self, worker_argv: list[str], num_workers: int, stop_grace_s: float = STOP_GRACE_S) -> None:
        """stop_grace_s: how long the workers may take to drain after SIGTERM before they are killed.
        A worker that dies is started again at once; MAX_FAILED_STARTS quick exits in a row stop them all."""
        policy = RestartPolicy(
            backoff_start_s=0.0,
            backoff_max_s=0.0,
            settle_s=QUICK_EXIT_S,
            max_failed_starts=MAX_FAILED_STARTS,
            stop_grace_s=stop_grace_s,
        )
        super().__init__([Slot(name=f"worker {i}") for i in range(num_workers)], policy)
        self.worker_argv = worker_argv
        self.run_dir = tempfile.mkdtemp(prefix="zerogap-workers-")
        self.metrics_dir = os.path.join(self.run_dir, "metrics")
        os.mkdir(self.metrics_dir)
        self.env = {
            **os.environ,
            "PROMETHEUS_MULTIPROC_DIR": self.metrics_dir,
            SHARED_LIMITS_ENV: os.path.join(self.run_dir, "limits.db"),
        }

    def run(self) -> int:
        try:
            return super().run()
        finally:
            shutil.rmtree(self.run_dir, ignore_errors=True)

    def spawn(self, child: Slot) -> subprocess.Popen[bytes]:
        # Its own session: a Ctrl-C in the terminal reaches only this supervisor, which forwards one
        # SIGTERM (a worker takes a second signal as "exit now"); the kernel sends SIGTERM if we die.
        proc = popen_in_group(self.worker_argv, self.env)
        log.info("%s started (pid %d)", child.name, proc.pid)
        return proc

    def on_exit(self, child: Slot, code: int | None) -> None:
        from prometheus_client import multiprocess

        assert child.proc is not None
        multiprocess.mark_process_dead(child.proc.pid, self.metrics_dir)

    def on_restart(self, child: Slot, code: int | None, delay_s: float) -> None:
        assert child.proc is not None
        log.warning("%s (pid %d) exited with code %s; starting a new one", child.name, child.proc.pid, code)

    def report(self, message: str) -> None:
        log.error("%s; stopping", message)

    def on_kill(self, child: Slot) -> None:
        log.warning("%s did not stop within %.0f s; killing it", child.name, self.policy.stop_grace_s)

    def on_stopped(self, asked: bool) -> None:
        log.info("all %d workers stopped", len(self.children))


def worker_argv(argv: list[str]) -> list[str]:
    """The command line of one worker: this command without --workers, plus --reuse-port."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg == "--workers":
            skip = True
            continue
        if arg.startswith("--workers="):
            continue
        out.append(arg)
    return zerogap_command("gateway", *out, "--reuse-port")
