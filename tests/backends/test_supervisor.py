"""The supervisor with real child processes (small Python servers): start-up failure,
deadline, process groups stopped whole. Restart with back-off is in test_cli.py."""

from __future__ import annotations

import io
import os
import sys
import threading
import time

import pytest

from backends.supervisor import ChildSpec, Hooks, StartupFailure, Supervisor, Timing
from common.net import free_port, wait_for_port
from common.process_group import group_alive

SERVER = """
import http.server, subprocess, sys
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])  # a grandchild, as vLLM's engine core
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404); self.end_headers()
    def log_message(self, *a): pass
print("serving", flush=True)
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def spec(name: str, code: str, port: int, *args: str) -> ChildSpec:
    return ChildSpec(name, [sys.executable, "-c", code, *args], "127.0.0.1", port, dict(os.environ))


def test_failure_before_ready_is_diagnosed_and_fatal() -> None:
    out = io.StringIO()
    hooks = Hooks(diagnose=lambda child, code: f"{child.spec.name} said {child.tail[-1]!r}, code {code}")
    code = "import sys; print('model folder missing', flush=True); sys.exit(3)"
    sup = Supervisor([spec("r0", code, free_port())], hooks, Timing(startup_timeout_s=20))
    sup.out = out
    assert sup.run() == 1
    assert "r0 said 'model folder missing', code 3" in out.getvalue()


def test_deadline_names_the_setting_and_kills_the_group() -> None:
    sup = Supervisor([spec("r0", "import time; time.sleep(60)", free_port())], Hooks(), Timing(startup_timeout_s=1))
    sup.start_all()
    with pytest.raises(StartupFailure, match=r"within 1 s.*startup_timeout_s"):
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            sup.poll_once()
            time.sleep(0.1)
    sup.stop_all()
    proc = sup.children[0].proc
    assert proc is not None and not group_alive(proc.pid)


def test_stop_takes_the_whole_group_with_no_orphans() -> None:
    port = free_port()
    sup = Supervisor([spec("r0", SERVER, port, str(port))], Hooks(), Timing(stop_timeout_s=5), io.StringIO())
    runner = threading.Thread(target=sup.run)
    runner.start()
    try:
        wait_for_port(port, 120)
        deadline = time.monotonic() + 10
        while sup.children[0].state != "up" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sup.children[0].state == "up"
        proc = sup.children[0].proc
        assert proc is not None and group_alive(proc.pid)
    finally:
        sup.request_stop()
        runner.join(30)
    assert not runner.is_alive()
    assert not group_alive(proc.pid), "a process of the replica's group outlived the stop"
