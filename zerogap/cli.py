"""The `zerogap` console script: a thin dispatcher.

Each command group owns its own argument parser in its own module; this file only
maps the first word of the command line to that module's ``main(argv) -> int``
(or to ``module:function``, for a package's public face).
Modules are imported lazily so that `zerogap keys list` does not pay for matplotlib.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

COMMANDS: dict[str, tuple[str, str]] = {
    "gateway": ("gateway.cli", "serve the gateway in front of the pool config.toml names"),
    "keys": ("gateway.tenants.keys_cli", "create, list and revoke virtual keys"),
    "sim": ("backends.sim.cli", "one simulated engine; `sim plan` runs a load plan in virtual time"),
    "backends": ("backends.cli", "`backends up`: start the pool config.toml describes"),
    "tune": ("zerogap.tune.cli", "try engine settings on a pool (or in virtual time), rank by goodput, say why"),
    "tiny-model": ("backends.tiny_model", "build a tiny random Llama + tokenizer locally"),
    "report": ("loadtest:report_main", "(re)render a run's report; two runs side by side"),
    "demo": ("zerogap.demo", "the whole loop on one command, no GPU needed"),
}


def _usage() -> str:
    width = max(len(name) for name in COMMANDS)
    lines = ["usage: zerogap COMMAND [options]", "", "commands:"]
    for name, (_, help_text) in COMMANDS.items():
        lines.append(f"  {name.ljust(width)}  {help_text}")
    lines.append("")
    lines.append("Run `zerogap COMMAND --help` for a command's options.")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    if args[0] in ("-V", "--version"):
        from zerogap import __version__

        print(f"zerogap {__version__}")
        return 0
    command = args[0]
    if command not in COMMANDS:
        print(f"zerogap: unknown command {command!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module_name, _, function = COMMANDS[command][0].partition(":")
    entry = getattr(importlib.import_module(module_name), function or "main")
    result: int = entry(args[1:])
    return result


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
