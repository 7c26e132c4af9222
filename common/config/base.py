"""The base of every config.toml section: unknown keys are refused, defaults validated, and
types are strict: `max_num_seqs = "256"` or `async_scheduling = "yes"` is refused, not
coerced (an integer is still accepted where a float belongs). The one exception is text
that ${VAR} substitution produced (FromEnv): an environment variable is always text, so
it is read as the field's type (`port = "${PORT}"` with PORT=8000 gives 8000)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError, model_validator

_LAX: dict[Any, TypeAdapter[Any]] = {}


class FromEnv(str):
    """A string that ${VAR} substitution produced (common.config.loader.expand_env)."""

    __slots__ = ()


def _holds_env(value: Any) -> bool:
    """A FromEnv itself, or a list / table of scalars with one in it (a nested section handles its own)."""
    if isinstance(value, FromEnv):
        return True
    items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
    return any(isinstance(item, FromEnv) for item in items)


def _lax(annotation: Any) -> TypeAdapter[Any]:
    adapter = _LAX.get(annotation)
    if adapter is None:
        adapter = _LAX[annotation] = TypeAdapter(annotation)  # pydantic's default: lax, "8000" -> 8000
    return adapter


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True, strict=True)

    @model_validator(mode="before")
    @classmethod
    def _env_text_as_typed(cls, data: Any) -> Any:
        """Values from environment variables, read as the field's type; one that does not read is left
        as it is, and the strict check says what is wrong with it."""
        if not isinstance(data, dict) or not any(_holds_env(value) for value in data.values()):
            return data
        out = dict(data)
        for name, value in data.items():
            field = cls.model_fields.get(name) if isinstance(name, str) else None
            if field is None or not _holds_env(value):
                continue
            try:
                out[name] = _lax(field.annotation).validate_python(value)
            except ValidationError:
                pass
        return out
