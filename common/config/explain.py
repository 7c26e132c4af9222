"""Read a settings file and validate it into a typed model, turning every failure into
one message for the user: the file, the field's path, what is wrong and what to do.
Shared by config.toml (common.config.loader) and settings.json (loadtest)."""

from __future__ import annotations

import difflib
import re
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from common.config.base import FromEnv

ModelT = TypeVar("ModelT", bound=BaseModel)
SECRET_FIELD = re.compile(r"(key|password|secret|token|_url)$")  # values never echoed (URLs may hold passwords)
# strict types (config.toml): what belongs there, in words, for a value of the wrong type
_STRICT_KINDS = {"int_type": "an integer", "float_type": "a number", "bool_type": "true or false"}
_TRUE, _FALSE = {"true", "yes", "on", "1", "y", "t"}, {"false", "no", "off", "0", "n", "f"}


def describe_validation_error(
    error: Mapping[str, Any], path: str, unknown: str = "key", known: Sequence[str] = ()
) -> str:
    """One pydantic error as a line for the user: the field's path, what is wrong, what to do.
    Shared by config.toml (paths like [server].port) and settings.json (load_test.steps).
    known: the keys allowed where an unknown one was found (the closest is suggested)."""
    kind = error["type"]
    loc = error.get("loc") or ("",)
    if kind == "extra_forbidden":
        close = difflib.get_close_matches(str(loc[-1]), known, n=1, cutoff=0.6)
        if close:
            return f"{path}: unknown {unknown}; did you mean `{close[0]}`? Rename it."
        return f"{path}: unknown {unknown}. Remove it or check its spelling."
    if kind == "missing":
        return f"{path}: required, but missing. Add it."
    got = error.get("input")
    secret = bool(SECRET_FIELD.search(str(loc[-1])))
    message = str(error["msg"]).removeprefix("Value error, ")
    hint = _wrong_type(kind, got, str(loc[-1]), secret) if kind in _STRICT_KINDS else None
    if hint:
        return f"{path}: {message}{hint}"
    shown = "" if isinstance(got, dict | list) or secret else f" (got {got!r})"
    return f"{path}: {message}{shown}. Fix the value."


def _wrong_type(kind: str, got: Any, name: str, secret: bool) -> str | None:
    """What to write instead of a quoted number or boolean, a float where an integer belongs, or a
    boolean where a number belongs (config.toml's types are strict); None for anything else."""
    want = _STRICT_KINDS[kind]
    if isinstance(got, FromEnv):
        shown = "" if secret else f' "{got}"'
        return f", but its environment variable gave{shown}. Set the variable to {want}."
    if isinstance(got, str):
        fix = _unquoted(kind, got.strip())
        shown = "a string" if secret else f'the string "{got}"'
        write = f"Write {name} = {fix} (no quotes)." if fix and not secret else f"Write {want} without quotes."
        return f", not {shown}. {write}"
    if kind == "int_type" and isinstance(got, float) and got.is_integer() and not secret:
        return f" (got {got!r}). Write {name} = {int(got)}, without the decimal point."
    if kind != "bool_type" and isinstance(got, bool):
        return f", not {str(got).lower()}. Write a number."
    return None


def _unquoted(kind: str, text: str) -> str | None:
    """The value a quoted text means, as it is written without quotes; None when it means none."""
    if kind == "bool_type":
        lowered = text.lower()
        return "true" if lowered in _TRUE else "false" if lowered in _FALSE else None
    try:
        number = int(text) if kind == "int_type" else float(text)
    except ValueError:
        return None
    return str(number) if kind == "int_type" else text


def known_keys(model: type[BaseModel], loc: tuple[int | str, ...]) -> list[str]:
    """The keys the model allows at loc's parent (for the closest to an unknown key at loc)."""
    current: type[BaseModel] | None = model
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        field = current.model_fields.get(part) if current is not None else None
        current = _model_in(field.annotation) if field is not None else None
    if current is None:
        return []
    return [field.alias or name for name, field in current.model_fields.items()]


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The model in X, list[X], X | None; None when there is none."""
    if typing.get_origin(annotation) is None and isinstance(annotation, type):
        return annotation if issubclass(annotation, BaseModel) else None
    for arg in typing.get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


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
        lines = [
            describe_validation_error(e, path_of(tuple(e["loc"])), unknown, known_keys(model, tuple(e["loc"])))
            for e in exc.errors()
        ]
        problems = "\n  ".join(lines)
        raise error(f"{source}: {exc.error_count()} problem(s):\n  {problems}") from None
