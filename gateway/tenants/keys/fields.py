"""What a virtual key's fields may hold: one check shared by the admin API, `zerogap keys`
(local store and --url) and both stores, so that no path can store what another refuses.

Why each bound:
- name: it becomes a metric label and a log field, so a short, plain charset.
- models: the allow-list is matched by exact name, so a name that is empty or holds a comma,
  whitespace or a control character can only be a mistake. The old SQLite store joined names
  with commas and `[""]` became "every model"; the list is now stored as a list and checked.
- the limits (rpm, tpm, max_concurrency, ...): whole numbers from 1 to each one's bound, which
  KeyLimits (gateway/tenants/keys/base.py) gives with its reason.
- expires_in_days: a positive, finite number of days (at most a century).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from common.openai_request import MAX_MODEL_CHARS
from gateway.tenants.keys.base import NO_LIMITS, KeyLimits, KeyStoreError

MAX_NAME_CHARS = 64
NAME_PATTERN = re.compile(r"[A-Za-z0-9_.@:-]+")
MAX_MODELS = 256
MAX_EXPIRES_IN_DAYS = 36_500
FIELDS = ("name", "models", *KeyLimits.names(), "expires_in_days")


class InvalidKeyField(KeyStoreError):
    """A field of a new key holds what it may not; `param` names the field."""

    def __init__(self, param: str, reason: str) -> None:
        super().__init__(f"{param}: {reason}")
        self.param = param


@dataclass(frozen=True)
class KeyFields:
    """A new key's fields, checked."""

    name: str
    models: tuple[str, ...] | None = None
    limits: KeyLimits = NO_LIMITS
    expires_in_days: float | None = None


def check_name(value: object) -> str:
    if not isinstance(value, str):
        raise InvalidKeyField("name", 'give the key a name, a string such as "team-a".')
    if not 1 <= len(value) <= MAX_NAME_CHARS or not NAME_PATTERN.fullmatch(value):
        raise InvalidKeyField(
            "name", f"use 1 to {MAX_NAME_CHARS} characters among letters, digits and _ . @ : - (got {value[:80]!r})."
        )
    return value


def _model_problem(name: object) -> str | None:
    if not isinstance(name, str):
        return "each model must be a string"
    if not name:
        return "a model name is empty (leave `models` out to allow every model)"
    if len(name) > MAX_MODEL_CHARS:
        return f"a model name is longer than {MAX_MODEL_CHARS} characters"
    if any(c == "," or c.isspace() or not c.isprintable() for c in name):
        return f"{name!r} holds a comma, whitespace or a control character; give each model as its own name"
    return None


def check_models(value: object) -> tuple[str, ...] | None:
    """The allow-list as a tuple of names; None (absent) allows every model."""
    if value is None:
        return None
    if isinstance(value, str | bytes | Mapping) or not isinstance(value, Iterable):
        raise InvalidKeyField("models", 'give a list of model names, such as ["llama-3-8b"].')
    value = tuple(value)
    if not value:
        raise InvalidKeyField("models", "the list is empty; name at least one model, or leave `models` out for all.")
    if len(value) > MAX_MODELS:
        raise InvalidKeyField("models", f"at most {MAX_MODELS} models per key (got {len(value)}).")
    for name in value:
        problem = _model_problem(name)
        if problem is not None:
            raise InvalidKeyField("models", problem + ".")
    return value


def check_count(param: str, value: object, maximum: int) -> int | None:
    """A whole number from 1 to `maximum`, or None (no limit)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= maximum:
        raise InvalidKeyField(param, f"give a whole number from 1 to {maximum}, or leave it out for no limit.")
    return value


def check_days(value: object) -> float | None:
    if value is None:
        return None
    # compared before any conversion: float(10**400) would overflow; NaN and inf fail the comparison
    if isinstance(value, int | float) and not isinstance(value, bool) and 0 < value <= MAX_EXPIRES_IN_DAYS:
        return float(value)
    raise InvalidKeyField(
        "expires_in_days", f"give a number of days above 0 and at most {MAX_EXPIRES_IN_DAYS}, or leave it out."
    )


def check_limits(values: Mapping[str, object] | KeyLimits) -> KeyLimits:
    """Each limit checked against its bound (absent: no limit), in KeyLimits's order."""
    given = values.as_dict() if isinstance(values, KeyLimits) else values
    return KeyLimits(**{n: check_count(n, given.get(n), KeyLimits.maximum(n)) for n in KeyLimits.names()})


def checked(
    name: object,
    models: object = None,
    limits: Mapping[str, object] | KeyLimits = NO_LIMITS,
    expires_in_days: object = None,
) -> KeyFields:
    """The fields, checked in the order a reader fills them in; InvalidKeyField at the first bad one."""
    return KeyFields(check_name(name), check_models(models), check_limits(limits), check_days(expires_in_days))


def parse_key_fields(body: Mapping[str, object]) -> KeyFields:
    """A JSON body of POST /admin/keys, checked: unknown fields are refused too (a typo is no limit)."""
    for field in body:
        if field not in FIELDS:
            raise InvalidKeyField(str(field)[:80], f"unknown field; the fields are {', '.join(FIELDS)}.")
    if "name" not in body:
        raise InvalidKeyField("name", 'required: give the key a name, such as "team-a".')
    return checked(body["name"], body.get("models"), body, body.get("expires_in_days"))
