"""`zerogap gateway --workers N`: N gateway processes on one port, kept alive by this supervisor.

Each worker is `zerogap gateway ... --reuse-port`: it binds the port itself with SO_REUSEPORT, so the
kernel spreads new connections evenly over the workers. The supervisor checks that the port is
free, starts the workers with PROMETHEUS_MULTIPROC_DIR set to a fresh temporary folder (GET /metrics
in any worker then shows the sum over all of them) and, without [gateway].redis_url, a file of
shared rate-limit buckets (gateway/limits/sqlite.py); it restarts a worker that dies, and on SIGINT
or SIGTERM sends SIGTERM to every worker (each drains: gateway/drain.py), waits for them, and
removes the folder; a second signal is forwarded too (the workers then exit at once).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from types import FrameType

from gateway.limits.sqlite import SHARED_LIMITS_ENV
from zerogap.commands import zerogap_command
from zerogap.process_group import new_group_preexec

log = logging.getLogger("zerogap.gateway.workers")

POLL_S = 0.2
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


@dataclass
class Worker:
    index: int
    proc: subprocess.Popen[bytes]
    started_s: float = field(default_factory=time.monotonic)


class Supervisor:
    def __init__(self, worker_argv: list[str], num_workers: int, stop_grace_s: float = STOP_GRACE_S) -> None:
        """stop_grace_s: how long the workers may take to drain after SIGTERM before they are killed."""
        self.worker_argv = worker_argv
        self.num_workers = num_workers
        self.stop_grace_s = stop_grace_s
        self.run_dir = tempfile.mkdtemp(prefix="zerogap-workers-")
        self.metrics_dir = os.path.join(self.run_dir, "metrics")
        os.mkdir(self.metrics_dir)
        self.env = {
            **os.environ,
            "PROMETHEUS_MULTIPROC_DIR": self.metrics_dir,
            SHARED_LIMITS_ENV: os.path.join(self.run_dir, "limits.db"),
        }
        self.workers: list[Worker] = []
        self.stopping = False
        self.num_failed_starts = 0

    def _spawn(self, index: int) -> Worker:
        # Its own session: a Ctrl-C in the terminal reaches only this supervisor, which forwards one
        # SIGTERM (a worker takes a second signal as "exit now"); the kernel sends SIGTERM if we die.
        proc = subprocess.Popen(self.worker_argv, env=self.env, start_new_session=True, preexec_fn=new_group_preexec())
        log.info("worker %d started (pid %d)", index, proc.pid)
        return Worker(index, proc)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self.stopping:  # a second Ctrl-C: the workers' second signal, "do not wait for the drain"
            self._signal_all(signal.SIGTERM)
        self.stopping = True

    def _signal_all(self, sig: int) -> None:
        for w in self.workers:
            if w.proc.poll() is None:
                w.proc.send_signal(sig)

    def _replace(self, worker: Worker) -> Worker | None:
        from prometheus_client import multiprocess

        code = worker.proc.returncode
        multiprocess.mark_process_dead(worker.proc.pid, self.metrics_dir)
        quick = time.monotonic() - worker.started_s < QUICK_EXIT_S
        self.num_failed_starts = self.num_failed_starts + 1 if quick else 0
        if self.num_failed_starts >= MAX_FAILED_STARTS:
            log.error("worker %d keeps exiting at start (code %s); stopping", worker.index, code)
            return None
        log.warning("worker %d (pid %d) exited with code %s; starting a new one", worker.index, worker.proc.pid, code)
        return self._spawn(worker.index)

    def run(self) -> int:
        signal.signal(signal.SIGINT, self._on_signal)
        signal.signal(signal.SIGTERM, self._on_signal)
        try:
            self.workers = [self._spawn(i) for i in range(self.num_workers)]
            return self._watch()
        finally:
            self._stop_all()
            shutil.rmtree(self.run_dir, ignore_errors=True)

    def _watch(self) -> int:
        while not self.stopping:
            time.sleep(POLL_S)
            for i, worker in enumerate(self.workers):
                if self.stopping or worker.proc.poll() is None:
                    continue
                replacement = self._replace(worker)
                if replacement is None:
                    return 1
                self.workers[i] = replacement
        return 0

    def _stop_all(self) -> None:
        self._signal_all(signal.SIGTERM)
        deadline = time.monotonic() + self.stop_grace_s
        for w in self.workers:
            try:
                w.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("worker %d did not stop within %.0f s; killing it", w.index, self.stop_grace_s)
                w.proc.kill()
                w.proc.wait()
        log.info("all %d workers stopped", len(self.workers))


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
