"""Plain helpers for tests (fixtures live in conftest.py; nothing is imported from there)."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def zerogap_cmd(*args: str) -> list[str]:
    """Run the console script through this interpreter (works without PATH set up)."""
    return [sys.executable, "-m", "zerogap", *args]
