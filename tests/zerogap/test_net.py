"""common.net.port_is_free: one rule for every command that checks a port before it starts
(the gateway, its workers, the backends' replicas), for IPv4 and IPv6 hosts alike."""

from __future__ import annotations

import random
import socket
from pathlib import Path

import pytest

from common import port_claims
from common.net import free_port, port_is_free


def test_a_port_nobody_holds_is_free_on_ipv4_and_ipv6() -> None:
    assert port_is_free("127.0.0.1", free_port())
    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as sock:
        sock.bind(("::1", 0))
        port = sock.getsockname()[1]
    assert port_is_free("::1", port)  # an IPv4-only check refused every IPv6 host as busy


def test_a_listening_port_is_busy_on_ipv4_and_ipv6() -> None:
    for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            sock.listen()
            assert not port_is_free(host, sock.getsockname()[1])


def test_a_port_held_with_so_reuseport_is_busy() -> None:
    """The gateway's workers hold their port with SO_REUSEPORT: a second gateway must not start on it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        assert not port_is_free("127.0.0.1", sock.getsockname()[1])


def test_a_host_that_does_not_resolve_is_not_free() -> None:
    assert not port_is_free("no-such-host.invalid", 8000)


def test_free_ports_come_from_below_the_ephemeral_range() -> None:
    """Where outgoing connections never take their local port (a fresh clone's suite lost a gateway's
    port to that, or to another process handed the same one)."""
    low = port_claims.ephemeral_low()
    ports = {free_port() for _ in range(20)}
    assert len(ports) == 20 and all(port_claims.LOWEST_PORT <= p < low for p in ports), (sorted(ports), low)


def test_two_processes_drawing_the_same_port_get_different_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each draw is claimed in a folder every process shares: the same random sequence in two
    processes (two Random(7)s here) hands the second the next port, not the first's."""
    monkeypatch.setenv("ZEROGAP_PORT_CLAIMS", str(tmp_path))
    monkeypatch.setattr(port_claims, "_rng", random.Random(7))
    first = port_claims.claimed_port("127.0.0.1", port_is_free)
    monkeypatch.setattr(port_claims, "_rng", random.Random(7))
    second = port_claims.claimed_port("127.0.0.1", port_is_free)
    assert first is not None and second is not None and first != second
    assert (tmp_path / str(first)).exists() and (tmp_path / str(second)).exists()


def test_a_claim_holds_for_its_time_then_may_be_taken_over(tmp_path: Path) -> None:
    path = tmp_path / "20001"
    assert port_claims.claim(path, now=1_000.0)
    assert not port_claims.claim(path, now=1_000.0 + port_claims.CLAIM_S - 1)
    assert port_claims.claim(path, now=1_000.0 + port_claims.CLAIM_S + 1)  # stale: renewed for the new holder
    assert not port_claims.claim(path, now=1_000.0 + port_claims.CLAIM_S + 2)


def test_a_claimed_port_that_cannot_be_bound_is_passed_over(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZEROGAP_PORT_CLAIMS", str(tmp_path))
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        busy = held.getsockname()[1]
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as other:
            other.bind(("127.0.0.1", 0))
            free = other.getsockname()[1]
        draws = iter([busy, free])
        monkeypatch.setattr(port_claims, "LOWEST_PORT", 1024)
        monkeypatch.setattr(port_claims, "_rng", type("Draws", (), {"randrange": lambda self, a, b: next(draws)})())
        monkeypatch.setattr(port_claims, "ephemeral_low", lambda: 65_000)
        assert port_claims.claimed_port("127.0.0.1", port_is_free) == free
