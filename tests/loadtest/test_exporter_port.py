"""The load generator's metrics port taken by another process (issue 42): the run is refused with the
fix, before a request is sent, instead of going on while Prometheus scrapes the other process's
numbers into this run's dashboards."""

from __future__ import annotations

import socket
from pathlib import Path

from tests.fixtures.upstream import Behavior, UpstreamServer
from tests.loadtest.helpers import run_locust, write_settings
from tests.support import QuietHandler, serving


class OtherLoadTest(QuietHandler):
    """Another harness's /metrics on the port."""

    def do_GET(self) -> None:
        self.reply(200, b"zerogap_loadtest_users 32.0\n", "text/plain")


def _refused(tmp_path: Path, port: int, name: str) -> tuple[str, int, int]:
    with UpstreamServer(Behavior()) as up:
        settings = write_settings(
            tmp_path / f"{name}.json", up.url, tmp_path / "runs", name, metrics={"exporter_port": port}
        )
        result = run_locust(settings, timeout_s=60)
        num_requests = len(up.requests)
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    return result.stderr, result.returncode, num_requests


def test_a_taken_exporter_port_refuses_the_run_with_the_fix(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        stderr, returncode, num_requests = _refused(tmp_path, port, "plain")
    assert returncode == 2 and num_requests == 0, stderr[-3000:]
    assert f"zerogap loadtest: metrics.exporter_port {port} on 127.0.0.1 is taken (" in stderr, stderr[-3000:]
    assert "by another process: Prometheus scrapes that port" in stderr
    assert "set metrics.exporter_port in settings.json to a free port and the zerogap-loadtest target" in stderr
    assert not (tmp_path / "runs").exists()  # no run folder for a run that did not start


def test_the_refusal_names_another_load_test(tmp_path: Path) -> None:
    with serving(OtherLoadTest) as url:
        stderr, returncode, _ = _refused(tmp_path, int(url.rsplit(":", 1)[1]), "other")
    assert returncode == 2, stderr[-3000:]
    assert "by another zerogap load test (a Locust process still running?)" in stderr, stderr[-3000:]
