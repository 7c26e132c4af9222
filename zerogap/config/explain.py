"""Read a settings file and validate it into a typed model, turning every failure into
one message for the user: the file, the field's path, what is wrong and what to do.
Shared by config.toml (zerogap.config.loader) and settings.json (loadtest)."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

ModelT = TypeVar("ModelT", bound=BaseModel)
SECRET_FIELD = re.compile(r"(key|password|secret|token|_url)$")  # values never echoed (URLs may hold passwords)


def describe_validation_error(error: Mapping[str, Any], path: str, unknown: str = "key") -> str:
    """One pydantic error as a line for the user: the field's path, what is wrong, what to do.
    Shared by config.toml (paths like [server].port) and settings.json (load_test.steps)."""
    kind = error["type"]
    if kind == "extra_forbidden":
        return f"{path}: unknown {unknown}. Remove it or check its spelling."
    if kind == "missing":
        return f"{path}: required, but missing. Add it."
    got = error.get("input")
    loc = error.get("loc") or ("",)
    secret = bool(SECRET_FIELD.search(str(loc[-1])))
    shown = "" if isinstance(got, dict | list) or secret else f" (got {got!r})"
    message = str(error["msg"]).removeprefix("Value error, ")
    return f"{path}: {message}{shown}. Fix the value."


def read_text(file: Path, missing_hint: str, error: type[Exception]) -> str:
    """The file's text, or `error` saying it is missing (and `missing_hint`) or unreadable."""
    try:
        return file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise error(f"{file}: no such file. {missing_hint}") from None
    except OSError as exc:
        raise error(f"{file}: cannot be read ({exc.strerror}).") from None


def validate(
    model: type[ModelT],
    raw: Any,
    source: str,
    path_of: Callable[[tuple[int | str, ...]], str],
    error: type[Exception],
    unknown: str = "key",
) -> ModelT:
    """model.model_validate(raw), or `error` listing every problem with its field's path."""
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        lines = [describe_validation_error(e, path_of(tuple(e["loc"])), unknown) for e in exc.errors()]
        problems = "\n  ".join(lines)
        raise error(f"{source}: {exc.error_count()} problem(s):\n  {problems}") from None
