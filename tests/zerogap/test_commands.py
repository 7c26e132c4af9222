"""zerogap_command runs this checkout's `zerogap` through this interpreter (no console script on PATH needed)."""

from __future__ import annotations

import subprocess

import zerogap
from common.commands import zerogap_command
from tests.support import REPO


def test_the_command_runs_zerogap_with_its_arguments_in_a_child() -> None:
    done = subprocess.run(
        zerogap_command("--version"), cwd=REPO, env={}, capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == f"zerogap {zerogap.__version__}"
