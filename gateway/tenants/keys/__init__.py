"""Virtual keys and their usage, behind one interface (base.py: Store, KeyRecord, the errors),
kept by one of two stores: the embedded SQLite file (sqlite.py, the default; its file and schema
upgrades: sqlite_schema.py) or PostgreSQL (postgres.py, with [gateway].database_url), which every
gateway process and pod on one database shares. auto.py opens the one config.toml names;
fields.py checks a key's fields (name, models, limits) the same way for both."""

from __future__ import annotations

from gateway.tenants.keys.auto import open_store
from gateway.tenants.keys.base import DuplicateKeyName, KeyRecord, KeyStoreError, Store, UsageRow

__all__ = ["DuplicateKeyName", "KeyRecord", "KeyStoreError", "Store", "UsageRow", "open_store"]
