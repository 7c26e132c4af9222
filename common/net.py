"""Local ports and readiness, shared by the launchers, the demo, the benches and the
tests: is a port free, does a URL answer 200, wait until it does."""

from __future__ import annotations

import ipaddress
import socket
import subprocess
import time
import urllib.error
import urllib.request
from urllib.parse import urlsplit, urlunsplit

from common.port_claims import claimed_port

HEALTH_TIMEOUT_S = 1.0
# Replicas are local: never through an http_proxy from the environment.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now, claimed below the ephemeral range so that no outgoing connection
    and no other process picking at the same time gets it (common/port_claims.py); else the OS picks."""
    claimed = claimed_port(host, port_is_free) if ":" not in host else None
    if claimed is not None:
        return claimed
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def port_is_free(host: str, port: int) -> bool:
    """True when nothing listens on host:port and this process may bind it: a plain bind (so a
    socket held with SO_REUSEPORT counts as busy) of the address host resolves to, IPv4 or IPv6."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror:
        return False
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except OSError:
            return False
    return True


def http_ok(url: str, timeout_s: float = HEALTH_TIMEOUT_S) -> bool:
    """True when GET url answers 200 within timeout_s."""
    try:
        with _OPENER.open(url, timeout=timeout_s) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _check_alive(proc: subprocess.Popen[bytes] | subprocess.Popen[str] | None, what: str) -> None:
    if proc is not None and proc.poll() is not None:
        raise RuntimeError(f"{what} exited with {proc.returncode} before it was ready")


def wait_for_port(
    port: int,
    timeout_s: float = 20.0,
    proc: subprocess.Popen[bytes] | subprocess.Popen[str] | None = None,
    host: str = "127.0.0.1",
) -> None:
    """Until host:port accepts a connection; RuntimeError if `proc` exits first, else TimeoutError."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        _check_alive(proc, f"the process behind port {port}")
        try:
            with socket.create_connection((host, port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"port {port} did not open within {timeout_s} s")


def wait_http_ok(
    url: str,
    timeout_s: float = 30.0,
    proc: subprocess.Popen[bytes] | subprocess.Popen[str] | None = None,
    what: str = "the server",
) -> None:
    """Until GET url answers 200; RuntimeError if `proc` exits first, else TimeoutError."""
    deadline = time.monotonic() + timeout_s
    while True:
        _check_alive(proc, what)
        if http_ok(url, timeout_s=2.0):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} at {url} did not answer 200 within {timeout_s} s")
        time.sleep(0.1)


def public_url(url: str) -> str:
    """The URL without user:password@, query and fragment: what may be shown to the metrics key's holder."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:  # IPv6 literal
        host = f"[{host}]"
    netloc = f"{host}:{parts.port}" if parts.port is not None else host
    return urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))


def client_ip(host: str | None) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """A client's address as a server gives it (an IPv4 address mapped into IPv6 as its IPv4
    self); None for anything that is no address (a Unix socket, a name)."""
    if host is None:
        return None
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address
