"""Plain helpers for tests (fixtures live in conftest.py; nothing is imported from there)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from zerogap.commands import zerogap_command

REPO = Path(__file__).resolve().parent.parent


def zerogap_cmd(*args: str) -> list[str]:
    """Run the console script through this interpreter (works without PATH set up)."""
    return zerogap_command(*args)


def wait_until(predicate: Callable[[], object], what: str, timeout_s: float) -> None:
    """Polls predicate every 0.1 s until it is true; fails the test after timeout_s, naming what it waited for."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s:g} s"
        time.sleep(0.1)
