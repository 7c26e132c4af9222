"""Ports for local servers that no other process on this machine is handed at the same time.

A port the OS picks (`bind(("127.0.0.1", 0))`, then closed) comes from the ephemeral range, the
one `connect()` draws its local ports from: between the pick and the server's own bind, any
outgoing connection on the machine may take it, and another process picking at the same moment
may be handed the same one. A fresh clone's suite (four test processes, thousands of connections)
met it: `zerogap gateway` could not serve on a port a test had just been given.

So a port is drawn at random below the ephemeral range (where `connect()` never goes), claimed for
CLAIM_S by a file created exclusively in a directory every process shares (the first to create it
has it; a claim older than CLAIM_S is stale and may be taken over), and handed out only if it can
be bound now. Where the ephemeral range leaves too little room below it, the OS picks, as before.
"""

from __future__ import annotations

import os
import random
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

CLAIM_S = 120.0  # long enough for the server it was picked for to bind it
LOWEST_PORT = 20_000
MIN_RANGE = 2_000  # fewer ports than this below the ephemeral range: let the OS pick
MAX_TRIES = 200
EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_rng = random.Random()


def claim_dir() -> Path:
    return Path(os.environ.get("ZEROGAP_PORT_CLAIMS", Path(tempfile.gettempdir()) / "zerogap-port-claims"))


def ephemeral_low() -> int:
    """The first port of the range the kernel hands out for outgoing connections (32768 by default)."""
    try:
        return int(EPHEMERAL_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


def claimed_port(host: str, is_free: Callable[[str, int], bool]) -> int | None:
    """A port below the ephemeral range, claimed for this caller and free on host now (`is_free`:
    common.net.port_is_free); None when there is no such range here (or none in MAX_TRIES draws)."""
    high = ephemeral_low()
    if high - LOWEST_PORT < MIN_RANGE:
        return None
    folder = claim_dir()
    folder.mkdir(parents=True, exist_ok=True)
    for _ in range(MAX_TRIES):
        port = _rng.randrange(LOWEST_PORT, high)
        if claim(folder / str(port)) and is_free(host, port):
            return port
    return None


def claim(path: Path, now: float | None = None) -> bool:
    """True if this call now holds the claim at path: created it, or found it stale and renewed it."""
    now = time.time() if now is None else now
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        try:
            if now - path.stat().st_mtime < CLAIM_S:
                return False
            os.utime(path, (now, now))  # stale: taken over
            return True
        except OSError:
            return False
    except OSError:
        return False
    os.close(fd)
    os.utime(path, (now, now))
    return True
