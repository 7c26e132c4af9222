"""The real `locust -f loadtest/` web UI: its page is served, its start form's users and
ramp-up fields come from settings.json (the first step), shown, not hidden at 0, and a start
with other values follows the steps and says so."""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from common.net import free_port, wait_for_port
from common.process_group import stop_process
from tests.loadtest.helpers import LOCUST, write_settings
from tests.support import REPO


def template_args(page: str) -> dict[str, Any]:
    """What Locust's page hands its form: `window.templateArgs = {...}`."""
    found = re.search(r"window\.templateArgs = (\{.*\})\s*$", page, re.M)
    assert found, page[-2000:]
    args: dict[str, Any] = json.loads(found.group(1))
    return args


def wait_for_text(path: Path, text: str, proc: subprocess.Popen[bytes], timeout_s: float = 30) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        if text in path.read_text():
            return True
        time.sleep(0.2)
    return text in path.read_text()


def test_the_start_form_is_filled_from_settings(tmp_path: Path) -> None:
    settings = write_settings(tmp_path / "s.json", "http://127.0.0.1:9", tmp_path / "runs", "ui",
                              load_test={"steps": [24, 48], "spawn_rate": 0})  # fmt: skip
    port = free_port()
    cmd = [LOCUST, "-f", str(REPO / "loadtest"), "--settings", str(settings), "--web-host", "127.0.0.1",
           "--web-port", str(port)]  # fmt: skip
    log = tmp_path / "locust.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=sink)
    try:
        wait_for_port(port, timeout_s=120, proc=proc)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as response:
            assert response.status == 200
            args = template_args(response.read().decode())
        # Start with another users value: the steps still rule, and the log says so
        form = urllib.parse.urlencode({"user_count": 5, "spawn_rate": 24}).encode()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/swarm", data=form, timeout=10) as response:
            assert json.loads(response.read())["success"] is True
        said = wait_for_text(log, "the run follows settings.json's steps (the first: 24 users", proc)
    finally:
        stop_process(proc)
    assert said, log.read_text()[-3000:]
    assert args["num_users"] == 24  # the first step's users
    assert args["spawn_rate"] == 24.0  # spawn_rate 0: all at once (the users in one second)
    assert not args["hide_common_options"]  # the fields are shown (hidden, Locust's form says 0)
    err = log.read_text()
    assert "Duplicate" not in err and "Traceback" not in err
