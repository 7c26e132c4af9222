"""Shared test helpers: free ports, subprocess servers, waiting for readiness."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from backends.process_group import stop_process
from zerogap.net import free_port, wait_for_port

__all__ = ["free_port", "stop_process", "wait_for_port", "zerogap_cmd"]

REPO = Path(__file__).resolve().parent.parent


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
