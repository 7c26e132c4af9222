"""A key made a moment ago authenticates, whichever way the gateway's two reads of the key store
(the periodic refresh and an unknown key's re-read) interleave: the real SQLite store, with gates
that hold a read where a slow store would (events, not timing)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from gateway.tenants.auth import Authenticator
from gateway.tenants.keys.base import KeyRecord
from gateway.tenants.keys.sqlite import SqliteStore

UNIFIED = "sk-unified-0123456789abcdef"


class GatedStore(SqliteStore):
    """The SQLite store, whose next version() or keys() answer can be held until a gate opens:
    `hold_version` holds the answer of the next version() call, `hold_keys` the next keys()'s (read
    at once, answered when the gate opens: a snapshot from before what happens meanwhile)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.version_gates: list[asyncio.Event] = []
        self.keys_gates: list[asyncio.Event] = []
        self.reads: list[str] = []
        self._read = asyncio.Condition()

    async def _note(self, read: str) -> None:
        async with self._read:
            self.reads.append(read)
            self._read.notify_all()

    async def until_reads(self, expected: list[str]) -> None:
        """Until the reads so far are `expected` (bounded)."""
        async with asyncio.timeout(10), self._read:
            await self._read.wait_for(lambda: self.reads == expected)

    def hold_version(self) -> asyncio.Event:
        self.version_gates.append(asyncio.Event())
        return self.version_gates[-1]

    def hold_keys(self) -> asyncio.Event:
        self.keys_gates.append(asyncio.Event())
        return self.keys_gates[-1]

    async def version(self) -> int:
        version = await super().version()
        await self._note("version")
        if self.version_gates:
            await self.version_gates.pop(0).wait()
        return version

    async def keys(self) -> list[KeyRecord]:
        records = await super().keys()
        await self._note("keys")
        if self.keys_gates:
            await self.keys_gates.pop(0).wait()
        return records


async def opened(tmp_path: Path) -> tuple[GatedStore, Authenticator]:
    store = GatedStore(tmp_path / "keys.db")
    await store.open()
    auth = Authenticator(UNIFIED, store)
    await auth.reload()
    store.reads.clear()
    return store, auth


def bearer(key: str) -> bytes:
    return f"Bearer {key}".encode()


async def test_a_key_the_periodic_refresh_loaded_during_a_misses_read_is_found(tmp_path: Path) -> None:
    """The refresh reads the new version and loads the new key while the request that missed it is
    reading the version: that read then finds nothing new, and the key must still be found."""
    store, auth = await opened(tmp_path)
    key = await store.create("fresh")
    refresh_keys = store.hold_keys()
    refresh = asyncio.create_task(auth.reload())  # the periodic refresh: version read, keys held
    await store.until_reads(["version", "keys"])
    miss_version = store.hold_version()
    request = asyncio.create_task(auth.authenticate(bearer(key), "10.0.0.1"))
    await asyncio.sleep(0)  # the request misses and starts its re-read (held at the version, or at the lock)
    refresh_keys.set()
    assert await asyncio.wait_for(refresh, 10) is True  # the refresh loaded the key
    miss_version.set()
    principal = await asyncio.wait_for(request, 10)
    assert principal.name == "fresh"
    await store.close()


async def test_a_slow_read_from_before_a_key_never_replaces_a_newer_one(tmp_path: Path) -> None:
    """The refresh's snapshot of the keys was read before the key was made and answers last: it
    must not replace what the miss's later read loaded (the key, the newer version)."""
    store, auth = await opened(tmp_path)
    await store.create("older")  # a change the refresh sees (its version differs from the loaded one)
    refresh_keys = store.hold_keys()
    refresh = asyncio.create_task(auth.reload())
    await store.until_reads(["version", "keys"])  # its snapshot is taken: without "fresh"
    key = await store.create("fresh")
    request = asyncio.create_task(auth.authenticate(bearer(key), "10.0.0.1"))
    await asyncio.sleep(0.01)  # the miss's own read, done meanwhile when nothing orders the reads (the bug);
    refresh_keys.set()  # with them in order it waits for the refresh, and this wait decides nothing
    assert (await asyncio.wait_for(request, 10)).name == "fresh"
    await asyncio.wait_for(refresh, 10)
    # What is in memory now holds the key: a request for it reads nothing from the store (held forever).
    reads = len(store.reads)
    store.hold_version()
    assert (await asyncio.wait_for(auth.authenticate(bearer(key), "10.0.0.1"), 10)).name == "fresh"
    assert len(store.reads) == reads
    await store.close()
