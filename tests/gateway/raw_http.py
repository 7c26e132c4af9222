"""HTTP/1.1 over a raw socket, for tests that send what no HTTP client library would (endless or
trickled headers, half a body, pipelined requests) and watch when the server answers and closes."""

from __future__ import annotations

import json
import select
import socket
import time
from typing import Any

RECV_BYTES = 65536


class Response:
    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status, self.headers, self.body = status, headers, body

    def json(self) -> Any:
        return json.loads(self.body)


def parse(raw: bytes) -> Response:
    """A whole response with a Content-Length body (as error answers are)."""
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    return Response(int(status_line.split()[1]), headers, body)


class Conn:
    """A client connection; what was received past one response waits in `pending`."""

    def __init__(self, port: int, timeout_s: float = 20.0, sndbuf: int | None = None) -> None:
        """sndbuf: a small send buffer, so that what a send accepted is close to what the server
        has read (with the server's small receive buffer)."""
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if sndbuf is not None:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
        self.sock.settimeout(timeout_s)
        self.sock.connect(("127.0.0.1", port))
        self.pending = b""

    def sendall(self, data: bytes) -> None:
        self.sock.sendall(data)

    def readable(self) -> bool:
        return bool(self.pending) or bool(select.select([self.sock], [], [], 0)[0])

    def read_to_end(self) -> tuple[bytes, float]:
        """Everything until the server closes (EOF or reset), and when it closed (time.monotonic())."""
        data, self.pending = self.pending, b""
        while True:
            try:
                chunk = self.sock.recv(RECV_BYTES)
            except ConnectionResetError:
                break
            if not chunk:
                break
            data += chunk
        return data, time.monotonic()

    def read_response(self) -> Response:
        """One response, leaving the connection open (Content-Length or chunked bodies)."""
        while b"\r\n\r\n" not in self.pending:
            self._recv()
        head, _, self.pending = self.pending.partition(b"\r\n\r\n")
        response = parse(head)
        if "content-length" in response.headers:
            size = int(response.headers["content-length"])
            while len(self.pending) < size:
                self._recv()
            response.body, self.pending = self.pending[:size], self.pending[size:]
            return response
        response.body = b""
        while True:  # chunked
            while b"\r\n" not in self.pending:
                self._recv()
            size_line, _, rest = self.pending.partition(b"\r\n")
            size = int(size_line, 16)
            while len(rest) < size + 2:
                self._recv()
                rest = self.pending.partition(b"\r\n")[2]
            response.body += rest[:size]
            self.pending = rest[size + 2 :]
            if size == 0:
                return response

    def _recv(self) -> None:
        chunk = self.sock.recv(RECV_BYTES)
        if not chunk:
            raise ConnectionError("the server closed the connection in the middle of a response")
        self.pending += chunk

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Conn:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


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
