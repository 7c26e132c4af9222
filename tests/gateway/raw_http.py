"""HTTP/1.1 over a raw socket, for tests that send what no HTTP client library would (endless or
trickled headers, half a body) and watch when the server answers and closes."""

from __future__ import annotations

import json
import socket
import time
from typing import Any

RECV_BYTES = 65536


def connect(port: int, timeout_s: float = 20.0, sndbuf: int | None = None) -> socket.socket:
    """A connected socket; sndbuf: a small send buffer, so that what a send accepted is close to
    what the server has read (with the server's small receive buffer)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if sndbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
    sock.settimeout(timeout_s)
    sock.connect(("127.0.0.1", port))
    return sock


def request(method: str, path: str, headers: dict[str, str] | None = None, body: bytes = b"") -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1"]
    lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
    if body:
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def chat_request(key: str, max_tokens: int = 4, stream: bool = False, headers: dict[str, str] | None = None) -> bytes:
    body = {"model": "m", "messages": [{"role": "user", "content": "a b c"}], "max_tokens": max_tokens}
    if stream:
        body["stream"] = True
    auth = {"Authorization": f"Bearer {key}", "Content-Type": "application/json", **(headers or {})}
    return request("POST", "/v1/chat/completions", auth, json.dumps(body).encode())


def read_to_end(sock: socket.socket) -> tuple[bytes, float]:
    """Everything until the server closes (EOF or reset), and when it closed (time.monotonic())."""
    data = b""
    while True:
        try:
            chunk = sock.recv(RECV_BYTES)
        except ConnectionResetError:
            break
        if not chunk:
            break
        data += chunk
    return data, time.monotonic()


class Response:
    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status, self.headers, self.body = status, headers, body

    def json(self) -> Any:
        return json.loads(self.body)


def parse(raw: bytes) -> Response:
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    return Response(int(status_line.split()[1]), headers, body)


def read_response(sock: socket.socket) -> Response:
    """One response, leaving the connection open (Content-Length or chunked bodies)."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        buf += _recv(sock)
    response = parse(buf)
    if "content-length" in response.headers:
        while len(response.body) < int(response.headers["content-length"]):
            response.body += _recv(sock)
        return response
    while not response.body.endswith(b"0\r\n\r\n"):
        response.body += _recv(sock)
    response.body = _unchunk(response.body)
    return response


def _recv(sock: socket.socket) -> bytes:
    chunk = sock.recv(RECV_BYTES)
    if not chunk:
        raise ConnectionError("the server closed the connection in the middle of a response")
    return chunk


def _unchunk(raw: bytes) -> bytes:
    out = b""
    while True:
        size_line, _, raw = raw.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            return out
        out, raw = out + raw[:size], raw[size + 2 :]
