"""`--grid NAME=V1,V2`: the settings to try, every combination, each one checked by
config.toml's own model (the same messages as a bad config.toml) before anything starts."""

from __future__ import annotations

import difflib
import itertools
import tomllib
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from common.config import ConfigError
from common.config.loader import describe_validation_error, field_path
from common.config.model import Config

SECTIONS = ("scheduler", "token_interval", "engine", "sim")
PARTNERS = {"async_scheduling": "overlap_token_interval", "overlap_token_interval": "async_scheduling"}


@dataclass(frozen=True)
class Axis:
    section: str
    name: str
    values: tuple[Any, ...]

    @property
    def key(self) -> str:
        return f"{self.section}.{self.name}"


@dataclass(frozen=True)
class Candidate:
    settings: dict[str, Any]  # "section.field" -> value, as the grid set it
    config: Config

    @property
    def label(self) -> str:
        return " ".join(f"{key.split('.', 1)[1]}={_text(value)}" for key, value in self.settings.items())


def _text(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _fields(section: str) -> dict[str, Any]:
    model: type[BaseModel] = Config.model_fields[section].annotation  # type: ignore[assignment]
    return dict(model.model_fields)


def _value(text: str) -> Any:
    """A TOML value (16, true, 0.5, "x"); a bare word stays a string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def parse_axis(item: str) -> Axis:
    name, sep, values = item.partition("=")
    name = name.strip()
    if not sep or not name or not values.strip():
        raise ConfigError(f"--grid {item!r}: write NAME=V1,V2 (e.g. --grid max_num_seqs=128,256).")
    section, _, field = name.rpartition(".")
    owners = [section] if section else [s for s in SECTIONS if field in _fields(s)]
    if section and section not in SECTIONS:
        raise ConfigError(f"--grid {name}: [{section}] cannot be tuned. Use a field of " + _sections() + ".")
    if not owners or field not in _fields(owners[0]):
        raise ConfigError(f"--grid {name}: no such field in {_sections()}. {_suggest(section, field)}")
    if len(owners) > 1:
        raise ConfigError(f"--grid {name}: in {', '.join(owners)}; name one: --grid {owners[0]}.{field}=...")
    parsed = tuple(_value(text.strip()) for text in values.split(","))
    return Axis(owners[0], field, parsed)


def _suggest(section: str, field: str) -> str:
    """The closest field of the tunable sections (of the one named, if one is), as config.toml's errors
    suggest one: "Did you mean max_num_seqs?"; else a word to check the spelling."""
    names = {f"{s}.{f}" if section else f: f for s in ([section] if section else SECTIONS) for f in _fields(s)}
    close = difflib.get_close_matches(f"{section}.{field}" if section else field, list(names), n=1, cutoff=0.6)
    if not close:
        return "Check its spelling."
    return f"Did you mean `{close[0]}`? (--grid {close[0]}=...)"


def _sections() -> str:
    return ", ".join(f"[{s}]" for s in SECTIONS)


def _apply(base: dict[str, Any], settings: dict[str, Any]) -> dict[str, Any]:
    raw = {key: dict(value) if isinstance(value, dict) else value for key, value in base.items()}
    for key, value in settings.items():
        section, name = key.split(".", 1)
        raw.setdefault(section, {})[name] = value
        partner = PARTNERS.get(name)
        if partner in _fields(section) and f"{section}.{partner}" not in settings:
            raw[section][partner] = value
    return raw


def candidates(base: Config, axes: list[Axis]) -> list[Candidate]:
    """Every combination, in grid order; a bad value raises ConfigError naming --grid."""
    seen = {axis.key for axis in axes}
    if len(seen) < len(axes):
        raise ConfigError("--grid: a field is named twice. Give each field once, with all its values.")
    raw = base.model_dump(exclude_unset=True)  # what the file set, and the grid: vLLM gets flags for those only
    out = []
    for combo in itertools.product(*(axis.values for axis in axes)):
        settings = {axis.key: value for axis, value in zip(axes, combo, strict=True)}
        try:
            config = Config.model_validate(_apply(raw, settings))
        except ValidationError as exc:
            problems = "\n  ".join(describe_validation_error(e, field_path(tuple(e["loc"]))) for e in exc.errors())
            raise ConfigError(f"--grid {Candidate(settings, base).label}: {problems}") from None
        config.source, config.base_dir = base.source, base.base_dir
        out.append(Candidate(settings, config))
    return out
