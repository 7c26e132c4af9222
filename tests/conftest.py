"""Shared test helpers: free ports, subprocess servers, waiting for readiness."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from backends.health import free_port
from backends.process_group import stop_process

__all__ = ["free_port", "stop_process", "wait_for_port", "zerogap_cmd"]

REPO = Path(__file__).resolve().parent.parent


def wait_for_port(port: int, timeout_s: float = 20.0, proc: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before port {port} opened")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"port {port} did not open within {timeout_s} s")


def zerogap_cmd(*args: str) -> list[str]:
    """Run the console script through this interpreter (works without PATH set up)."""
    return [sys.executable, "-m", "zerogap", *args]


@pytest.fixture
def port() -> int:
    return free_port()


@pytest.fixture
def clean_env() -> Iterator[dict[str, str]]:
    """An environment for child processes without the developer's TAOTOKEN_API_KEY."""
    env = {k: v for k, v in os.environ.items() if k != "TAOTOKEN_API_KEY"}
    yield env
