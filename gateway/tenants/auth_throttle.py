"""Failed-auth throttling per client address: key guessing gets `limit` tries per window.

After [gateway].auth_failures_limit failed authentications (401: missing, malformed, invalid or
expired key) from one address within auth_failure_window_s (counted from its first failure), the
address gets 429 with Retry-After until window_s after the failure that reached the limit. Tries
during the block are not counted (nor looked up in the key store): a guesser gets at most `limit`
answers per window, and a client that honours Retry-After is let back in when it says.

A blocked address is refused even when it sends a valid key, since a guesser whose guess is right
must not see it answered differently. One exception keeps an office behind one NAT address working
while someone in it (a script with a revoked key in a retry loop, say) trips the limit: a key that
already authenticated from that address passes (`known_good`). Only keys that worked there before
do, so a guess never gains by it; a valid key new to that address waits for the block to end.

IPv6 addresses count by their /64, the block a single host or site is usually given. The tables are
bounded (about 22 MiB for both, full). Failures: MAX_ADDRESSES, the least recently failing address
leaves first; an attacker with more addresses than that can push its own entries out, but
per-address counting cannot stop one with that many addresses anyway. Known-good pairs are kept
per key: a key remembers at most MAX_ADDRESSES_PER_KEY addresses (the least recently seen leaves
first), so a client that churns addresses with its key pushes out only that key's own entries;
and past MAX_KNOWN_GOOD pairs in all, the key with the most addresses loses its least recently
seen one (of equals, the key that grew last). So a client cannot flush another's entry unless
it holds more keys than MAX_KNOWN_GOOD divided by the other key's number of addresses, and keys
are only the admin's to give.
Each gateway process counts on its own: with `--workers N` an address gets up to N x limit tries
per window.
"""

from __future__ import annotations

import ipaddress
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Callable

from gateway.server.errors import ApiError

log = logging.getLogger("zerogap.gateway.auth")

MAX_ADDRESSES = 32_768  # about 300 bytes each
MAX_KNOWN_GOOD = 32_768  # (key, address) pairs in all; about 400 bytes each when every key has one
MAX_ADDRESSES_PER_KEY = 1024
UNKNOWN_ADDRESS = "unknown"  # a server that reports no client address: all such clients share one count


class _Count:
    """One address's failures in its current window, and the end of its block (0: not blocked)."""

    __slots__ = ("blocked_until_s", "num_failures", "start_s")

    def __init__(self, now_s: float) -> None:
        self.start_s = now_s
        self.num_failures = 0
        self.blocked_until_s = 0.0


def address_group(client: str | None) -> str:
    """What failures count against: the IPv4 address, or the /64 of an IPv6 one."""
    if not client:
        return UNKNOWN_ADDRESS
    if ":" not in client:
        return client
    try:
        addr = ipaddress.IPv6Address(client)
    except ValueError:
        return client
    if addr.ipv4_mapped is not None:
        return str(addr.ipv4_mapped)
    return str(ipaddress.IPv6Network((int(addr) >> 64 << 64, 64)))


class AuthThrottle:
    def __init__(
        self,
        limit: int,
        window_s: float,
        clock: Callable[[], float] = time.monotonic,
        max_addresses: int = MAX_ADDRESSES,
        max_known_good: int = MAX_KNOWN_GOOD,
        max_addresses_per_key: int = MAX_ADDRESSES_PER_KEY,
    ) -> None:
        """limit: failures per window before the block (0: throttling off)."""
        self.limit = limit
        self.window_s = window_s
        self.clock = clock
        self.max_addresses = max_addresses
        self.max_known_good = max_known_good
        self.max_addresses_per_key = max_addresses_per_key
        self._counts: OrderedDict[str, _Count] = OrderedDict()
        self._known_good = KnownGood(max_known_good, max_addresses_per_key)

    @property
    def enabled(self) -> bool:
        return self.limit > 0

    @property
    def num_addresses(self) -> int:
        return len(self._counts)

    @property
    def num_known_good(self) -> int:
        return self._known_good.size

    def blocked_for_s(self, client: str | None) -> float:
        """Seconds the address stays blocked (0 if it is not)."""
        if not self._counts:
            return 0.0
        group = address_group(client)
        count = self._counts.get(group)
        if count is None:
            return 0.0
        left_s = count.blocked_until_s - self.clock()
        if left_s <= 0:
            return 0.0
        self._counts.move_to_end(group)  # a blocked address that keeps trying is the last to leave the table
        return left_s

    def known_good(self, client: str | None, name: str) -> bool:
        """True if the key `name` has authenticated from this address before."""
        return self._known_good.holds(name, address_group(client))

    def failed(self, client: str | None) -> bool:
        """Count a failed authentication; True if it starts the address's block."""
        if not self.enabled:
            return False
        now_s = self.clock()
        group = address_group(client)
        count = self._counts.get(group)
        if count is None or now_s - count.start_s >= self.window_s:
            count = _Count(now_s)
        self._counts[group] = count
        self._counts.move_to_end(group)
        count.num_failures += 1
        blocked = count.num_failures >= self.limit
        if blocked:
            count.blocked_until_s = now_s + self.window_s
            count.start_s = count.blocked_until_s  # counting starts again when the block ends
            count.num_failures = 0
            log.warning("client %s: %d failed authentications within %g s: refused (429) for %g s",
                        group, self.limit, self.window_s, self.window_s)  # fmt: skip
        self._trim(now_s)
        return blocked

    def succeeded(self, client: str | None, name: str) -> None:
        """The key `name` authenticated from this address: it may pass while the address is blocked."""
        if self.limit <= 0:
            return
        self._known_good.add(name, address_group(client))

    def _trim(self, now_s: float) -> None:
        """Drop the least recently seen entries while they are over (window and block both ended)
        or the table is over its bound."""
        counts = self._counts
        while counts:
            oldest = next(iter(counts.values()))
            counting = oldest.num_failures > 0 and now_s < oldest.start_s + self.window_s
            over = not counting and now_s >= oldest.blocked_until_s
            if not over and len(counts) <= self.max_addresses:
                return
            counts.popitem(last=False)

    def refusal(self, retry_after_s: float) -> ApiError:
        seconds = max(1, math.ceil(retry_after_s))
        return ApiError(
            429,
            f"Too many failed authentications from your address ({self.limit} within {self.window_s:g} s, "
            f"[gateway].auth_failures_limit). Check the key you send, and retry after {seconds} s.",
            "rate_limit_error",
            code="too_many_auth_failures",
            headers={"Retry-After": str(seconds)},
        )


class KnownGood:
    """(key, address) pairs, kept per key: each key's addresses least recently seen first, at most
    `per_key` of them; past `most` pairs in all, a pair leaves the key with the most addresses (of
    those, the one that grew last: the client adding pairs now). `_sizes[n]` holds the keys with n
    addresses, in the order they got there (so that key is found without a search)."""

    def __init__(self, most: int, per_key: int) -> None:
        self.most = most
        self.per_key = per_key
        self.size = 0
        self._by_key: dict[str, dict[str, None]] = {}  # plain dicts, in order of use: smaller than OrderedDict
        self._sizes: dict[int, dict[str, None]] = {}
        self._largest = 0

    def holds(self, name: str, group: str) -> bool:
        addresses = self._by_key.get(name)
        return addresses is not None and group in addresses

    def add(self, name: str, group: str) -> None:
        """On every authenticated request: a lookup, and a move to the end when the pair is known."""
        addresses = self._by_key.get(name)
        if addresses is None:
            addresses = self._by_key[name] = {}
        elif group in addresses:
            del addresses[group]
            addresses[group] = None
            return
        addresses[group] = None
        self.size += 1
        self._resized(name, len(addresses) - 1)
        if len(addresses) > self.per_key:
            self._drop_oldest(name)
        elif self.size > self.most:
            self._drop_oldest(next(reversed(self._sizes[self._largest])))

    def _drop_oldest(self, name: str) -> None:
        addresses = self._by_key[name]
        del addresses[next(iter(addresses))]
        self.size -= 1
        self._resized(name, len(addresses) + 1)
        if not addresses:
            del self._by_key[name]

    def _resized(self, name: str, was: int) -> None:
        """Move `name` from the keys with `was` addresses to those with its number now."""
        now = len(self._by_key[name])
        if was:
            keys = self._sizes[was]
            del keys[name]
            if not keys:
                del self._sizes[was]
        if now:
            self._sizes.setdefault(now, {})[name] = None
        if now > self._largest:
            self._largest = now
        while self._largest and self._largest not in self._sizes:
            self._largest -= 1
