"""One KeyLimits value (gateway/tenants/keys/base.py) carried whole: each of its fields is a column of
both stores, a field of the admin API's JSON, a `zerogap keys create` flag and a column of `keys list`,
all made from its list, so a new limit is written once there (and applied in gateway/tenants/limits/)."""

from __future__ import annotations

import sqlite3

import pytest

from gateway.endpoints.admin import key_json
from gateway.tenants.keys.base import KeyLimits
from gateway.tenants.keys.fields import FIELDS, InvalidKeyField, parse_key_fields
from gateway.tenants.keys.sqlite import KeyStore
from gateway.tenants.keys_cli import new_key_fields, parse_args, print_keys

LIMITS = {"rpm": 7, "tpm": 700, "max_concurrency": 3}


def test_every_limit_travels_whole_from_the_cli_to_the_store_and_back(tmp_path, capsys) -> None:
    assert set(KeyLimits.names()) == set(LIMITS)  # a new limit: give it a value here too
    flags = [f"--{name.replace('_', '-')}={value}" for name, value in LIMITS.items()]
    fields = new_key_fields(parse_args(["create", "--name", "k", *flags]))
    assert fields.limits == KeyLimits(**LIMITS)
    store = KeyStore(tmp_path / "keys.db")
    try:
        store.create("k", None, fields.limits)
        record = next(r for r in store.keys() if r.name == "k")
    finally:
        store.close()
    assert record.limits == KeyLimits(**LIMITS)
    shown = key_json(record, now=0.0)
    assert {name: shown[name] for name in KeyLimits.names()} == LIMITS
    assert parse_key_fields({"name": "k", **LIMITS}).limits == record.limits  # the admin API's body
    print_keys([record], [])
    assert capsys.readouterr().out.split("\n")[1].split()[3:6] == ["7", "700", "3"]


def test_each_limit_is_checked_against_its_own_bound() -> None:
    assert set(KeyLimits.names()) <= set(FIELDS)
    for name in KeyLimits.names():
        top = KeyLimits.maximum(name)
        assert getattr(parse_key_fields({"name": "k", name: top}).limits, name) == top
        for bad in (0, top + 1, True, 1.5, "3"):
            with pytest.raises(InvalidKeyField) as refused:
                parse_key_fields({"name": "k", name: bad})
            assert refused.value.param == name


def test_a_key_file_without_a_limits_column_gets_it_on_open_and_its_keys_keep_no_limit(tmp_path) -> None:
    """A file made before a limit was added: the column is added once (NULL: no limit), the keys reload."""
    path = tmp_path / "keys.db"
    store = KeyStore(path)
    store.create("old", None, KeyLimits(rpm=5))
    store.close()
    with sqlite3.connect(path) as db:
        db.execute("ALTER TABLE keys DROP COLUMN max_concurrency")
        version = db.execute("SELECT v FROM meta WHERE k='version'").fetchone()[0]
    store = KeyStore(path)
    try:
        assert [r.limits for r in store.keys()] == [KeyLimits(rpm=5)]
        store.create("new", None, KeyLimits(max_concurrency=2))
        assert {r.name: r.limits.max_concurrency for r in store.keys()} == {"old": None, "new": 2}
    finally:
        store.close()
    with sqlite3.connect(path) as db:
        assert int(db.execute("SELECT v FROM meta WHERE k='version'").fetchone()[0]) == int(version) + 2
