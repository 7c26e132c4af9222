"""System tools the tests run as real parts (Debian packages). A missing one FAILS the
test that needs it, with the command that installs it: a run without the tool must not
be green while testing nothing."""

from __future__ import annotations

import shutil

import pytest

# tool -> the Debian package that installs it (scripts/setup-system installs them all)
PACKAGES = {
    "prometheus": "prometheus",
    "promtool": "prometheus",
    "redis-server": "redis-server",
    "chromium": "chromium",
}


def require_tool(name: str) -> str:
    """The tool's path; fails the calling test when it is not installed."""
    path = shutil.which(name)
    if path is None:
        package = PACKAGES.get(name, name)
        pytest.fail(
            f"{name} is not installed: run scripts/setup-system (or: sudo apt-get install {package})", pytrace=False
        )
    return path
