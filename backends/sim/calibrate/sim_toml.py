"""CONFIG's text with its [sim] section replaced by fitted values (or one added): every
other line, comment and section is kept as the user wrote it."""

from __future__ import annotations

import re

_HEADER = re.compile(r"^\s*\[\[?\s*([A-Za-z0-9_.\-\"' ]+?)\s*\]\]?\s*(#.*)?$")


def _value(value: float | int | bool) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    text = f"{value:.6g}"
    return text if any(c in text for c in ".en") else text + ".0"  # a float stays a float


def sim_section(values: dict[str, float | int | bool], comment: str) -> list[str]:
    lines = [f"# {line}" if line else "#" for line in comment.splitlines()]
    lines.append("[sim]")
    lines += [f"{name} = {_value(value)}" for name, value in values.items()]
    return lines


def replace_sim(text: str, values: dict[str, float | int | bool], comment: str) -> str:
    """text with [sim] set to values: keys of CONFIG's [sim] that values does not name are kept
    (time_scale, seed, ...), the rest replaced; the section is appended when CONFIG has none."""
    lines = text.splitlines()
    start = end = None
    for i, line in enumerate(lines):
        match = _HEADER.match(line)
        if not match:
            continue
        if start is not None and end is None:
            end = i
        if match.group(1) == "sim" and not line.lstrip().startswith("[["):
            start = i
    if start is None:
        body = "\n".join(lines).rstrip("\n")
        return (body + "\n\n" if body else "") + "\n".join(sim_section(values, comment)) + "\n"
    end = len(lines) if end is None else end
    kept = [line for line in lines[start + 1 : end] if _key(line) not in values]
    while kept and not kept[-1].strip():
        kept.pop()
    new = sim_section(values, comment) + kept
    tail = lines[end:]
    return "\n".join(lines[:start] + new + ([""] if tail else []) + tail) + "\n"


def _key(line: str) -> str | None:
    match = re.match(r"^\s*([A-Za-z0-9_\-]+)\s*=", line)
    return match.group(1) if match else None
