"""`locust -f loadtest/` itself: bad settings stop it with a message, and Locust sees exactly
one user class and one shape in the folder (the web UI: test_webui_prefill.py)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.loadtest.helpers import LOCUST, run_locust, write_settings
from tests.support import REPO


def test_bad_settings_stop_the_run_with_field_and_reason(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"load_test": {"steps": [16, 0]}, "workload": {"max_output_tokens": -3}}')
    result = run_locust(bad, timeout_s=60)
    assert result.returncode == 2
    assert "load_test.steps: steps[1] is 0.0; every step must be > 0" in result.stderr
    assert "workload.max_output_tokens:" in result.stderr
    assert "Traceback" not in result.stderr


def test_missing_key_variable_is_named(tmp_path: Path) -> None:
    settings = write_settings(tmp_path / "s.json", "http://127.0.0.1:9", tmp_path, "x",
                              api={"api_key_env": "ZEROGAP_TEST_ABSENT_KEY"})  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "ZEROGAP_TEST_ABSENT_KEY"}
    result = run_locust(settings, env=env, timeout_s=60)
    assert result.returncode == 2
    assert "environment variable ZEROGAP_TEST_ABSENT_KEY is not set" in result.stderr
    assert "Traceback" not in result.stderr


def test_settings_named_by_the_environment_variable_are_read(tmp_path: Path) -> None:
    bad = tmp_path / "from-env.json"
    bad.write_text('{"load_test": {"warmup_seconds": -1}}')
    result = subprocess.run(
        [LOCUST, "-f", str(REPO / "loadtest"), "--headless"],
        cwd=tmp_path,  # no settings.json here
        env={**os.environ, "ZEROGAP_SETTINGS": str(bad)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert f"{bad}: 1 problem(s):" in result.stderr and "load_test.warmup_seconds:" in result.stderr


def test_locust_sees_one_user_class_in_the_folder(tmp_path: Path) -> None:
    result = subprocess.run([LOCUST, "-f", str(REPO / "loadtest"), "--list"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=60, check=False)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["Available", "Users:", "LlmUser"]
