"""Plain helpers for tests (fixtures live in conftest.py; nothing is imported from there)."""

from __future__ import annotations

from pathlib import Path

from zerogap.commands import zerogap_command

REPO = Path(__file__).resolve().parent.parent


def zerogap_cmd(*args: str) -> list[str]:
    """Run the console script through this interpreter (works without PATH set up)."""
    return zerogap_command(*args)
