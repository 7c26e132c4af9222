"""The SQLite key file: an old file (models joined with commas, no max_concurrency) is upgraded
in place and each allow-list keeps its meaning, through a real gateway; the file and its -wal
and -shm are readable by their owner only; bad fields never reach it."""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import sqlite3
import stat
import threading
from pathlib import Path

import pytest

from gateway.tenants.keys.base import KeyLimits, KeyStoreError
from gateway.tenants.keys.fields import InvalidKeyField
from gateway.tenants.keys.sqlite import KeyStore
from gateway.tenants.keys.sqlite_schema import SCHEMA_VERSION
from tests.fixtures.upstream import UpstreamServer
from tests.gateway.helpers import GatewayServer, auth, chat_body, error_of, make_config, post

OLD_SCHEMA = """
CREATE TABLE meta (k TEXT PRIMARY KEY, v TEXT NOT NULL);
CREATE TABLE keys (
    name TEXT PRIMARY KEY, digest TEXT NOT NULL UNIQUE, models TEXT, rpm INTEGER, tpm INTEGER,
    created_at REAL NOT NULL, expires_at REAL, revoked_at REAL
);
CREATE TABLE usage (
    key_name TEXT NOT NULL, model TEXT NOT NULL, num_requests INTEGER NOT NULL DEFAULT 0,
    prompt_tokens INTEGER NOT NULL DEFAULT 0, completion_tokens INTEGER NOT NULL DEFAULT 0,
    updated_at REAL NOT NULL, PRIMARY KEY (key_name, model)
);
"""
SECRET = "ab" * 32
# name -> what the old code stored in `models` (None: NULL)
OLD_MODELS = {"both": "m,other", "only-m": "m", "empty": "", "all": None, "odd": "m,"}


def old_key(name: str) -> str:
    return f"zg-old-secret-of-{name}"


def old_file(path: Path) -> Path:
    """A key file as zerogap wrote it before allow-lists became JSON lists (user_version 0)."""
    db = sqlite3.connect(path)
    db.executescript(OLD_SCHEMA)
    db.execute("INSERT INTO meta VALUES ('secret', ?), ('version', '3')", (SECRET,))
    for name, models in OLD_MODELS.items():
        digest = hmac.new(bytes.fromhex(SECRET), old_key(name).encode(), hashlib.sha256).hexdigest()
        db.execute("INSERT INTO keys VALUES (?, ?, ?, 60, NULL, 1.0, NULL, NULL)", (name, digest, models))
    db.execute("INSERT INTO usage VALUES ('both', 'm', 2, 10, 20, 1.0)")
    db.commit()
    db.close()
    path.chmod(0o644)  # as the old code left it
    return path


def raw_rows(path: Path) -> dict[str, tuple[object, ...]]:
    with sqlite3.connect(path) as db:
        return {r[0]: r[1:] for r in db.execute("SELECT name, models, rpm, max_concurrency FROM keys")}


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_old_file_is_upgraded_and_keeps_every_allow_list(tmp_path, caplog) -> None:
    path = old_file(tmp_path / "keys.db")
    with caplog.at_level(logging.WARNING, "zerogap.gateway.keys.sqlite"):
        store = KeyStore(path)
    records = {r.name: r for r in store.keys()}
    usage = store.usage()
    store.close()
    assert {n: r.models for n, r in records.items()} == {
        "both": ("m", "other"), "only-m": ("m",), "empty": (), "all": None, "odd": ("m", ""),
    }  # fmt: skip
    assert all(r.limits.max_concurrency is None and r.limits.rpm == 60 for r in records.values())
    assert [(u.key_name, u.num_requests, u.completion_tokens) for u in usage] == [("both", 2, 20)]
    rows = raw_rows(path)
    assert rows["both"] == ('["m", "other"]', 60, None) and rows["all"][0] is None and rows["empty"][0] == "[]"
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert db.execute("SELECT v FROM meta WHERE k='version'").fetchone()[0] == "4"  # gateways reload
    assert "'empty' had the allow-list [\"\"], which granted every model; it now grants none" in caplog.text
    assert mode(path) == 0o600 and "was mode 0644" in caplog.text
    again = KeyStore(path)  # a second open changes nothing
    assert {r.name: r.models for r in again.keys()} == {n: r.models for n, r in records.items()}
    again.close()
    assert raw_rows(path) == rows


async def test_upgraded_file_serves_the_same_models_through_a_gateway(tmp_path) -> None:
    old_file(tmp_path / "keys.db")  # the config's key_store
    with UpstreamServer(model="m") as up, UpstreamServer(model="other") as up2:
        config = make_config(tmp_path, [("b0", up.url, "m"), ("b1", up2.url, "other")])
        with GatewayServer(config) as gs:
            url = gs.url + "/v1/chat/completions"
            got = {}
            for name in OLD_MODELS:
                for model in ("m", "other"):
                    status, _, raw = await post(url, chat_body(model=model, stream=False), auth(old_key(name)))
                    got[(name, model)] = status
                    assert status == 200 or error_of(raw)["code"] == "model_not_found"  # not the key's
    assert got == {
        ("both", "m"): 200, ("both", "other"): 200, ("only-m", "m"): 200, ("only-m", "other"): 404,
        ("empty", "m"): 404, ("empty", "other"): 404, ("all", "m"): 200, ("all", "other"): 200,
        ("odd", "m"): 200, ("odd", "other"): 404,
    }  # fmt: skip


def test_workers_opening_an_old_file_together_upgrade_it_once(tmp_path) -> None:
    """Four workers open one old file at once, many times over: each opens it, and it is converted once.

    Leaving the old rollback journal for WAL is the step that collided (SQLite answers "database is locked"
    at once there): it did in about 1 round in 25, so 100 rounds meet it almost surely.
    """
    for round_ in range(100):
        path = old_file(tmp_path / f"keys{round_}.db")
        results = open_together(path, num_workers=4)
        assert len(results) == 4 and len(set(results)) == 1, (round_, results)
        assert raw_rows(path)["both"][0] == '["m", "other"]'  # converted once, not JSON of JSON


def open_together(path: Path, num_workers: int) -> list[object]:
    """What each of `num_workers` threads, released together, read from the store (or the error it met)."""
    results: list[object] = []
    start = threading.Barrier(num_workers)

    def open_it() -> None:
        start.wait()
        try:
            store = KeyStore(path)
            results.append(tuple(r.models for r in store.keys()))
            store.close()
        except Exception as exc:  # reported by the caller
            results.append(exc)

    threads = [threading.Thread(target=open_it) for _ in range(num_workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return results


def test_a_newer_file_is_refused(tmp_path) -> None:
    path = tmp_path / "keys.db"
    KeyStore(path).close()
    with sqlite3.connect(path) as db:
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(KeyStoreError, match="newer than this zerogap"):
        KeyStore(path)


def test_new_file_wal_and_shm_are_owner_only(tmp_path) -> None:
    old_umask = os.umask(0o022)  # a usual umask: files would be 0644
    try:
        path = tmp_path / "state" / "keys.db"
        store = KeyStore(path)
        store.create("k", models=["m"], limits=KeyLimits(max_concurrency=3))
        wal, shm = Path(f"{path}-wal"), Path(f"{path}-shm")
        assert wal.exists() and shm.exists()
        assert (mode(path), mode(wal), mode(shm)) == (0o600, 0o600, 0o600)
        assert raw_rows(path)["k"] == ('["m"]', None, 3)
        store.close()
    finally:
        os.umask(old_umask)


def test_existing_wider_wal_is_tightened(tmp_path, caplog) -> None:
    path = tmp_path / "keys.db"
    store = KeyStore(path)
    store.create("k")
    wal = Path(f"{path}-wal")
    path.chmod(0o640)
    wal.chmod(0o666)
    with caplog.at_level(logging.WARNING, "zerogap.gateway.keys.sqlite"):
        second = KeyStore(path)  # the first still holds the file open: the -wal stays
    assert (mode(path), mode(wal)) == (0o600, 0o600)
    assert "was mode 0640" in caplog.text and "was mode 0666" in caplog.text
    second.close()
    store.close()


@pytest.mark.parametrize(
    ("models", "words"),
    [
        ([""], "empty"),
        (["a,b"], "comma"),
        (["a b"], "whitespace"),
        (["m", "a\tb"], "whitespace"),
        (["a\x00b"], "control"),
        ([], "empty"),
        ("m", "list of model names"),
        (["x" * 257], "longer than 256"),
        ([f"m{i}" for i in range(257)], "at most 256"),
    ],
)
def test_bad_allow_lists_never_reach_the_file(tmp_path, models, words) -> None:
    store = KeyStore(tmp_path / "keys.db")
    with pytest.raises(InvalidKeyField, match=words) as caught:
        store.create("k", models=models)
    assert caught.value.param == "models" and store.keys() == []
    store.close()


def test_stored_json_that_cannot_be_read_allows_no_model(tmp_path, caplog) -> None:
    path = tmp_path / "keys.db"
    store = KeyStore(path)
    store.create("k", models=["m"])
    with sqlite3.connect(path) as db:
        db.execute("UPDATE keys SET models = 'm,other' WHERE name = 'k'")  # edited by hand
    with caplog.at_level(logging.WARNING, "zerogap.gateway.keys.sqlite"):
        assert store.keys()[0].models == ()
    assert "cannot be read" in caplog.text
    store.close()


def test_max_concurrency_round_trips_and_is_bounded(tmp_path) -> None:
    store = KeyStore(tmp_path / "keys.db")
    store.create("capped", limits=KeyLimits(max_concurrency=4))
    store.create("free")
    for bad in (0, -1, 100_001, True, 2.5):
        with pytest.raises(InvalidKeyField, match="max_concurrency"):
            store.create("bad", limits=KeyLimits(max_concurrency=bad))  # type: ignore[arg-type]
    assert {r.name: r.limits.max_concurrency for r in store.keys()} == {"capped": 4, "free": None}
    store.close()
    assert raw_rows(tmp_path / "keys.db")["capped"] == (None, None, 4)
