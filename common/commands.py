"""The argv that runs `zerogap COMMAND ...` as a child process: this interpreter with
`-m zerogap`, so a child runs the same code in the same environment, with or without
the console script on PATH."""

from __future__ import annotations

import sys


def zerogap_command(*args: str) -> list[str]:
    """[python, "-m", "zerogap", *args]: e.g. zerogap_command("sim", "--port", "8001")."""
    return [sys.executable, "-m", "zerogap", *args]
