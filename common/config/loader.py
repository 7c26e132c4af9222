"""Read config.toml: expand ${VAR}, validate, and turn every failure into one
message that names the file, the field's path and what to do."""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from common.config.base import FromEnv
from common.config.explain import describe_validation_error, read_text, validate
from common.config.model import Config

__all__ = ["ConfigError", "describe_validation_error", "expand_env", "field_path", "load_config", "parse_config"]

_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


class ConfigError(Exception):
    """A config file that cannot be used; str() is the message for the user."""


def field_path(loc: tuple[int | str, ...]) -> str:
    """('backends', 0, 'url') -> '[[backends]][0].url'; ('server', 'port') -> '[server].port'."""
    if not loc:
        return "(top level)"
    head, *rest = loc
    out = f"[[{head}]]" if rest and isinstance(rest[0], int) else f"[{head}]"
    for part in rest:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


def expand_env(
    value: Any,
    env: Mapping[str, str],
    source: str,
    loc: tuple[int | str, ...] = (),
    strict: bool = True,
) -> Any:
    """Replace ${VAR} and ${VAR:-default} in every string. A missing VAR is an error,
    or (strict=False, for commands that do not use the value) an empty string. A string
    with a substitution comes back as FromEnv: its field reads it as its own type."""
    if isinstance(value, dict):
        return {k: expand_env(v, env, source, (*loc, k), strict) for k, v in value.items()}
    if isinstance(value, list):
        return [expand_env(v, env, source, (*loc, i), strict) for i, v in enumerate(value)]
    if not isinstance(value, str):
        return value

    def substitute(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        if name in env:
            return env[name]
        if default is not None:
            return default
        if not strict:
            return ""
        raise ConfigError(
            f"{source}: {field_path(loc)}: environment variable {name} is not set. "
            f"Export it (export {name}=...) or write the value in the file."
        )

    expanded, num_substituted = _VAR.subn(substitute, value)
    return FromEnv(expanded) if num_substituted else value


def parse_config(
    text: str,
    source: str = "config.toml",
    env: Mapping[str, str] | None = None,
    base_dir: Path | None = None,
    strict_env: bool = True,
) -> Config:
    """strict_env=False: a missing ${VAR} becomes "" (for commands that never use it,
    such as `zerogap sim` reading a config whose [server].api_key the gateway needs)."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: not valid TOML: {exc}. Fix the syntax.") from None
    raw = expand_env(raw, os.environ if env is None else env, source, strict=strict_env)
    config = validate(Config, raw, source, field_path, ConfigError)
    config.source = source
    config.base_dir = base_dir or Path.cwd()
    return config


def load_config(
    path: str | Path = "config.toml",
    env: Mapping[str, str] | None = None,
    strict_env: bool = True,
) -> Config:
    file = Path(path)
    text = read_text(file, "Pass --config PATH, or run from the folder that has config.toml.", ConfigError)
    return parse_config(text, str(file), env, base_dir=file.resolve().parent, strict_env=strict_env)
