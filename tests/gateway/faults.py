"""Helpers of the fault tests: backends as processes (to SIGKILL/SIGSTOP), a backend that never
answers, and clients that record what they saw and when."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from common.net import free_port, wait_for_port
from common.process_group import stop_process
from tests.gateway.helpers import auth, chat_body
from tests.support import zerogap_cmd


@dataclass
class Proc:
    proc: subprocess.Popen[bytes]
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def signal(self, sig: int) -> None:
        os.kill(self.proc.pid, sig)


@contextlib.contextmanager
def upstream_process(*args: str, model: str = "m") -> Iterator[Proc]:
    """tests/fixtures/upstream.py as its own process (args: --ttft-s X --interval-s X ...).
    Always continued and stopped at the end, even if the test stopped it (SIGSTOP)."""
    port = free_port()
    cmd = [sys.executable, "-m", "tests.fixtures.upstream", "--port", str(port), "--model", model, *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port, 120, proc)
        yield Proc(proc, port)
    finally:
        resume_and_stop(proc)


def resume_and_stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGCONT)
    stop_process(proc, 5)


@contextlib.contextmanager
def mute_listener(port: int) -> Iterator[socket.socket]:
    """A socket on 127.0.0.1:port that completes TCP handshakes (the kernel's backlog) and never
    answers a byte: a backend that accepts and hangs."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(1024)
    try:
        yield sock
    finally:
        sock.close()


@dataclass
class Seen:
    """What one client saw: status, body, and its times (monotonic)."""

    status: int
    raw: bytes
    start_s: float
    end_s: float
    refused: bool = False  # no connection (a clean refusal)

    @property
    def finished(self) -> bool:
        return self.status == 200 and self.raw.rstrip().endswith(b"data: [DONE]") and self.error is None

    @property
    def error(self) -> dict[str, Any] | None:
        """The SSE error event, or the JSON error body."""
        for part in self.raw.decode(errors="replace").split("\n\n"):
            if part.startswith("data: {") and '"error"' in part:
                err: dict[str, Any] = json.loads(part[6:])["error"]
                return err
        if self.status != 200 and self.raw.startswith(b"{"):
            err = json.loads(self.raw)["error"]
            return err
        return None

    @property
    def words(self) -> list[str]:
        """The answer's words, as the client read them (the fixture upstream's are t0, t1, ...)."""
        text = ""
        for part in self.raw.split(b"\n\n"):
            if part.startswith(b"data: {"):
                for choice in json.loads(part[6:]).get("choices") or []:
                    text += (choice.get("delta") or {}).get("content") or choice.get("text") or ""
        return text.split()

    @property
    def num_content_chunks(self) -> int:
        """Chunks that carry text (one token each from the sim and the fixture)."""
        num = 0
        for part in self.raw.split(b"\n\n"):
            if part.startswith(b"data: {"):
                for choice in json.loads(part[6:]).get("choices") or []:
                    num += bool((choice.get("delta") or {}).get("content") or choice.get("text"))
        return num

    @property
    def num_tokens(self) -> int:
        """Tokens of the fixture upstream (" t0", " t1", ...)."""
        return self.raw.count(b'"content":" t')

    @property
    def num_chunks(self) -> int:
        """SSE data events other than an error and [DONE]."""
        parts = self.raw.split(b"\n\n")
        return sum(1 for p in parts if p.startswith(b"data: {") and not p.startswith(b'data: {"error"'))


async def one(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any], timeout_s: float = 15.0, key: str | None = None
) -> Seen:
    start_s = time.monotonic()
    headers = auth(key) if key else auth()
    try:
        async with asyncio.timeout(timeout_s):
            async with session.post(url + "/v1/chat/completions", json=body, headers=headers) as resp:
                raw = await resp.read()
                return Seen(resp.status, raw, start_s, time.monotonic())
    except aiohttp.ClientConnectorError:
        return Seen(0, b"", start_s, time.monotonic(), refused=True)
    except aiohttp.ClientError as exc:  # a connection cut mid-answer: neither clean nor finished
        return Seen(-1, str(exc).encode(), start_s, time.monotonic())
    except TimeoutError:
        return Seen(-2, b"client timeout: the gateway hung", start_s, time.monotonic())


def stream_body(max_tokens: int, **extra: Any) -> dict[str, Any]:
    return chat_body(max_tokens=max_tokens, ignore_eos=True, **extra)


def session() -> aiohttp.ClientSession:
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, force_close=True))


@contextlib.contextmanager
def gateway_process(config: Path, port: int, log: Path) -> Iterator[Proc]:
    """`zerogap gateway --config CONFIG` as its own process (stderr to log), stopped at the end."""
    with log.open("ab") as err:
        proc = subprocess.Popen(zerogap_cmd("gateway", "--config", str(config)), stdout=err, stderr=err)
    try:
        wait_for_port(port, 120, proc)
        yield Proc(proc, port)
    finally:
        resume_and_stop(proc)


def usage_of(raw: bytes) -> tuple[int, int]:
    """(prompt, completion) tokens from the usage chunk of a stream, (0, 0) without one."""
    for part in raw.split(b"\n\n"):
        if part.startswith(b"data: {") and b'"usage"' in part:
            usage = json.loads(part[6:]).get("usage") or {}
            return int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0))
    return 0, 0
