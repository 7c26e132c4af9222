"""vLLM command lines as {flag: value}, to compare the deploy files with the launcher's."""

from __future__ import annotations

import re

from backends.vllm.command import vllm_argv
from common.config.loader import load_config
from tests.deploy.paths import REPO

_DEFAULT = re.compile(r"\$\{[A-Za-z_][A-Za-z0-9_]*:-([^}]*)\}")
# Where each replica is and what it serves differ by deployment on purpose.
PER_DEPLOYMENT = {"--host", "--port", "--model", "--served-model-name"}


def _value(text: str) -> str:
    text = _DEFAULT.sub(r"\1", text)
    try:
        return repr(float(text))
    except ValueError:
        return text


def flag_map(argv: list[str]) -> dict[str, str]:
    """['--a=1', '--b', '2', '--c'] -> {'--a': '1.0', '--b': '2.0', '--c': ''}; positionals dropped."""
    out: dict[str, str] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("--") and "=" in arg:
            name, value = arg.split("=", 1)
            out[name] = _value(value)
        elif arg.startswith("--"):
            has_value = i + 1 < len(argv) and not argv[i + 1].startswith("--")
            out[arg] = _value(argv[i + 1]) if has_value else ""
            i += has_value
        i += 1
    return {k: v for k, v in out.items() if k not in PER_DEPLOYMENT}


def launcher_flags() -> dict[str, str]:
    """The engine flags `zerogap backends up` passes for the repository's config.toml."""
    config = load_config(REPO / "config.toml", strict_env=False)
    return flag_map(vllm_argv(config, "python", "MODEL", 8100)[3:])
