"""Open connections per client address, and the proxies trusted to name the client.

`[server] max_connections_per_client` bounds the connections one client address holds open in a
gateway process, so that one client cannot take the `max_connections` that every other client and
/health share. IPv4 counts by address, IPv6 by its /64 (gateway/tenants/auth_throttle.py's address_group).
A connection from a trusted proxy (`[server] forwarded_allow_ips`) speaks for many clients and is
not counted per client (only `max_connections` bounds it); nor is one with no address (a Unix
socket).

Connections refused for their client's count do not count toward `max_connections` either: they
are answered and closed at once (gateway/server/http_limits.py), and while they linger they are no one's.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from common.net import client_ip
from gateway.tenants.auth_throttle import address_group

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_trusted(entry: str) -> Network | None:
    """One `forwarded_allow_ips` entry: an address or a network (CIDR); None for "*" (everyone).
    ValueError for anything else."""
    entry = entry.strip()
    if entry == "*":
        return None
    return ipaddress.ip_network(entry, strict=False)


class TrustedProxies:
    """The addresses X-Forwarded-For is honoured from (uvicorn decides that; this only tells the
    per-client count which addresses are proxies)."""

    def __init__(self, entries: Iterable[str] = ()) -> None:
        parsed = [parse_trusted(entry) for entry in entries]
        self.everyone = any(network is None for network in parsed)
        self.networks = [network for network in parsed if network is not None]

    def __bool__(self) -> bool:
        return self.everyone or bool(self.networks)

    def __contains__(self, host: str) -> bool:
        if self.everyone:
            return True
        if not self.networks:
            return False
        address = client_ip(host)
        return address is not None and any(address in network for network in self.networks)


class ClientConnections:
    """The connections of one gateway process that count: in all, and per client address group."""

    def __init__(self, max_per_client: int, trusted: TrustedProxies | None = None) -> None:
        self.max_per_client = max_per_client
        self.trusted = trusted or TrustedProxies()
        self.num_open = 0  # counted toward max_connections
        self._per_client: dict[str, int] = {}

    def group_of(self, host: str | None) -> str | None:
        """What a connection from `host` counts against; None: no per-client count."""
        if not host or host in self.trusted:
            return None
        return address_group(host)

    def full(self, group: str | None) -> bool:
        """The client already holds its most connections: a new one is refused."""
        return group is not None and self._per_client.get(group, 0) >= self.max_per_client

    def opened(self, group: str | None) -> None:
        self.num_open += 1
        if group is not None:
            self._per_client[group] = self._per_client.get(group, 0) + 1

    def closed(self, group: str | None) -> None:
        self.num_open -= 1
        if group is not None:
            left = self._per_client[group] - 1
            if left:
                self._per_client[group] = left
            else:
                del self._per_client[group]

    def of(self, group: str) -> int:
        return self._per_client.get(group, 0)

    @property
    def num_clients(self) -> int:
        return len(self._per_client)
