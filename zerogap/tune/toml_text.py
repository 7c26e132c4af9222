"""The few TOML lines tune writes: a candidate's engine sections, and the lines to
paste for the best one. Values are scalars, lists of scalars or tables of them."""

from __future__ import annotations

import json
from typing import Any


def value_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string: the same escapes as JSON
    if isinstance(value, list | tuple):
        return "[" + ", ".join(value_text(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {value_text(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"no TOML text for {type(value).__name__}")


def sections_text(sections: dict[str, dict[str, Any]]) -> str:
    """[section] then `name = value` lines; None values are left out (the default)."""
    lines: list[str] = []
    for name, fields in sections.items():
        if lines:
            lines.append("")
        lines.append(f"[{name}]")
        lines += [f"{key} = {value_text(value)}" for key, value in fields.items() if value is not None]
    return "\n".join(lines) + "\n"


def paste_lines(settings: dict[str, Any]) -> str:
    """{"scheduler.max_num_seqs": 128, ...} as config.toml lines, grouped by section."""
    grouped: dict[str, dict[str, Any]] = {}
    for key, value in settings.items():
        section, name = key.split(".", 1)
        grouped.setdefault(section, {})[name] = value
    return sections_text(grouped)
