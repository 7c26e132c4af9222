"""The request log ([logging].request_log): one JSON line per completion request, when it ends.

    {"time": "2026-12-05T10:00:00.123Z", "request_id": "...", "key": "team-a", "model": "m",
     "engine": "gpu0", "status": 200, "error": null, "prompt_tokens": 12, "completion_tokens": 64,
     "ttft_ms": 51.2, "duration_ms": 3301.7, "overhead_ms": 0.41, "retries": 0, "continuations": 0,
     "client": "10.0.0.7", "path": "/v1/chat/completions", "stream": true, "trace_id": null}

`time` is when the request arrived (UTC); `prompt_tokens` and `completion_tokens` are what the
request was charged (the figures /admin/usage adds up); `key` is the key's name, never the key.

"stdout": each line is one write(2) to standard output (containers). A path: the file is opened
for appending, each line one write(2), so the processes of `--workers N` may share it; past
`request_log_max_mb` it is renamed FILE.1 (FILE.1 to FILE.2, ..., `request_log_keep` kept) under
an flock on FILE.lock, and every process moves on to the new FILE within a second.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import time
from pathlib import Path
from typing import Any

import msgspec

from common.config.observability import REQUEST_LOG_OFF, REQUEST_LOG_STDOUT

log = logging.getLogger("zerogap.gateway.request_log")

CHECK_EVERY_S = 1.0  # how often a writer looks whether another process rotated the file


def utc_iso(wall_s: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(wall_s)) + f".{int(wall_s * 1000) % 1000:03d}Z"


class RequestLog:
    """Writes the lines; `open` gives None for "off"."""

    def __init__(self, path: Path | None, max_bytes: int, keep: int) -> None:
        self.path = path  # None: standard output
        self.max_bytes = max_bytes
        self.keep = keep
        self._encode = msgspec.json.Encoder().encode
        self._fd = 1
        self._ino = 0
        self._size = 0
        self._checked_s = 0.0
        self.check_every_s = CHECK_EVERY_S
        if path is not None:
            self._open()

    @classmethod
    def open(cls, target: str, resolve: Any, max_mb: float, keep: int) -> RequestLog | None:
        if target == REQUEST_LOG_OFF:
            return None
        if target == REQUEST_LOG_STDOUT:
            return cls(None, 0, keep)
        path: Path = resolve(target)
        path.parent.mkdir(parents=True, exist_ok=True)
        return cls(path, int(max_mb * 1024 * 1024), keep)

    def write(self, record: dict[str, Any]) -> None:
        line = self._encode(record) + b"\n"
        try:
            if self.path is None:
                os.write(self._fd, line)
                return
            now = time.monotonic()
            if now - self._checked_s >= self.check_every_s:
                self._checked_s = now
                self._follow()
            os.write(self._fd, line)
            self._size += len(line)
            if self._size >= self.max_bytes:
                self._rotate()
        except OSError as exc:  # a full disk must not fail the request: the line is lost, and said so
            log.warning("request log %s: cannot write (%s)", self.path or "stdout", exc)

    def close(self) -> None:
        if self.path is not None and self._fd > 2:
            os.close(self._fd)
            self._fd = -1

    def _open(self) -> None:
        assert self.path is not None
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
        stat = os.fstat(fd)
        if self._fd > 2:
            os.close(self._fd)
        self._fd, self._ino, self._size = fd, stat.st_ino, stat.st_size

    def _follow(self) -> None:
        """Another process rotated the file (or it was removed): write to the new one."""
        assert self.path is not None
        try:
            stat = os.stat(self.path)
        except FileNotFoundError:
            self._open()
            return
        if stat.st_ino != self._ino:
            self._open()
        else:
            self._size = stat.st_size  # the others' lines count toward the size too

    def _rotate(self) -> None:
        assert self.path is not None
        lock_fd = os.open(f"{self.path}.lock", os.O_WRONLY | os.O_CREAT, 0o640)
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
            stat = os.stat(self.path)
            if stat.st_ino == self._ino and stat.st_size >= self.max_bytes:  # nobody rotated it meanwhile
                for i in range(self.keep - 1, 0, -1):
                    with contextlib.suppress(FileNotFoundError):
                        os.replace(f"{self.path}.{i}", f"{self.path}.{i + 1}")
                os.replace(self.path, f"{self.path}.1")
            self._open()
        finally:
            os.close(lock_fd)  # and its lock with it
