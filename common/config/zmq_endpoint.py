"""A ZeroMQ endpoint in the config: where a KV-event publisher binds ([sim]) or where the gateway
connects to one ([[backends]])."""

from __future__ import annotations

import re

_TCP = re.compile(r"tcp://(?P<host>\[[0-9a-fA-F:.]+\]|[^:/\s\[\]]+):(?P<port>\d{1,5})")


def check_zmq_endpoint(value: str, bind: bool) -> str:
    """The endpoint if it is tcp://HOST:PORT or ipc://PATH; ValueError saying what to write otherwise.
    A bind endpoint may use * as its host; one to connect to may not."""
    if value.startswith("ipc://") and len(value) > len("ipc://"):
        return value
    found = _TCP.fullmatch(value)
    if found is None or not 0 < int(found["port"]) < 65536:
        raise ValueError(f"{value!r} is not a ZeroMQ endpoint: write tcp://HOST:PORT (port 1-65535) or ipc://PATH")
    if found["host"] == "*" and not bind:
        raise ValueError(f"{value!r} is where the engine binds; the gateway connects: write the engine's host, "
                         f"e.g. tcp://127.0.0.1:{found['port']}")  # fmt: skip
    return value
