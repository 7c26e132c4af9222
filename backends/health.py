"""Small network checks the launchers share: is a port free, does /health answer 200."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request

HEALTH_TIMEOUT_S = 1.0
# Replicas are local: never through an http_proxy from the environment.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def port_is_free(host: str, port: int) -> bool:
    """True when nothing listens on host:port and this process may bind it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def health_ok(url: str, timeout_s: float = HEALTH_TIMEOUT_S) -> bool:
    try:
        with _OPENER.open(url, timeout=timeout_s) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False
