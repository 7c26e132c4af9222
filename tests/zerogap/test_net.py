"""common.net.port_is_free: one rule for every command that checks a port before it starts
(the gateway, its workers, the backends' replicas), for IPv4 and IPv6 hosts alike."""

from __future__ import annotations

import socket

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
