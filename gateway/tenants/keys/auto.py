"""The key store config.toml names: PostgreSQL with [gateway].database_url, else the
embedded SQLite file. Its own module, so that the Store interface imports neither
implementation (each implementation imports the interface)."""

from __future__ import annotations

from common.config import Config
from gateway.tenants.keys.base import Store
from gateway.tenants.keys.sqlite import SqliteStore


def open_store(config: Config) -> Store:
    """The store config.toml names (not yet opened: call `await store.open()`)."""
    if config.gateway.database_url:
        from gateway.tenants.keys.postgres import PostgresStore  # psycopg is imported only when it is used

        return PostgresStore(config.gateway.database_url)
    return SqliteStore(config.resolve_path(config.gateway.key_store))
