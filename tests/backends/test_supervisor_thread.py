"""SupervisorThread with real child processes (small Python servers): start() returns once every child
answers its health check, a child that cannot start fails start() with the caller's message as soon as the
supervisor gives up (not at the deadline), and stop() ends the supervisor and every child's process group."""

from __future__ import annotations

import io
import os
import sys

import pytest

from backends.supervisor import ChildSpec, Hooks, Supervisor, Timing
from backends.supervisor_thread import SupervisorThread
from common.net import free_port, http_ok
from common.process_group import group_alive

SERVER = """
import http.server, subprocess, sys
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])  # a grandchild in its group
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404); self.end_headers()
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""
LONG_S = 600.0  # a start-up deadline no test reaches: a failure seen sooner came from the supervisor ending


def _spec(name: str, code: str, port: int) -> ChildSpec:
    return ChildSpec(name, [sys.executable, "-c", code, str(port)], "127.0.0.1", port, dict(os.environ))


def test_start_returns_once_every_child_is_up_and_stop_ends_every_group() -> None:
    specs = [_spec(f"r{i}", SERVER, free_port()) for i in range(2)]
    supervisor = Supervisor(specs, Hooks(), Timing(startup_timeout_s=LONG_S, stop_timeout_s=5), io.StringIO())
    pool = SupervisorThread(supervisor, "test-pool")
    try:
        pool.start("the test pool did not come up")
        assert [child.state for child in supervisor.children] == ["up", "up"]
        assert all(http_ok(f"{spec.url}/health") for spec in specs)
    finally:
        pool.stop()
    assert not pool.running
    groups = [child.proc.pid for child in supervisor.children if child.proc is not None]
    assert len(groups) == 2 and not any(group_alive(pgid) for pgid in groups)


def test_a_child_that_cannot_start_fails_start_with_the_callers_message() -> None:
    out = io.StringIO()
    code = "import sys; print('no model folder', flush=True); sys.exit(3)"
    specs = [_spec("good", SERVER, free_port()), _spec("bad", code, free_port())]
    pool = SupervisorThread(Supervisor(specs, Hooks(), Timing(startup_timeout_s=LONG_S), out), "test-pool")
    try:
        with pytest.raises(RuntimeError, match=r"^the pool did not come up; see the log$"):
            pool.start("the pool did not come up; see the log")
        assert not pool.running  # the supervisor gave up and stopped the good child too
        assert "bad exited with code 3 before it was ready" in out.getvalue(), out.getvalue()
    finally:
        pool.stop()
