"""The gateway's view of a backend's HTTP client: a small interface tests may replace
(`create_app(config, client=...)`). The real one is gateway/upstream/http_client.py's HttpUpstream."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol


class UpstreamError(Exception):
    """The backend could not be reached or broke the connection.

    `reason` is a short label (metrics); `detail` is the whole story for the gateway's log
    (addresses, errno); `failure` says what went wrong in words a client may read: never an
    address, a port or an errno, which would map the internal network for any tenant."""

    def __init__(self, reason: str, detail: str, failure: str = "failed") -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail
        self.failure = failure

    def again(self) -> UpstreamError:
        """A fresh copy to raise: a stored error raised twice would carry the frames of both
        raises, and those frames hold its keeper (a reference cycle the collector must find)."""
        return UpstreamError(self.reason, self.detail, self.failure)


class UpstreamResponse(Protocol):
    status: int
    content_type: str

    async def read_chunk(self) -> bytes:
        """The next bytes as they arrive; b"" at the end. Raises UpstreamError if the connection breaks.
        Cancelling it loses nothing: the bytes wait for the next call."""
        ...

    async def read_all(self) -> bytes: ...

    def pipe(self, sink: Callable[[bytes], None]) -> asyncio.Future[None]:
        """From now on hand every body chunk to sink(data) from the connection's own callback
        (what is buffered first), instead of to read_chunk; the future ends with the body, or
        fails with UpstreamError if the connection breaks."""
        ...

    def pause_reading(self) -> None:
        """Read nothing more from the backend until resume_reading (the sink's side is full)."""
        ...

    def resume_reading(self) -> None: ...

    def close(self) -> None:
        """Drop the connection now (the backend sees it close and can free the slot)."""
        ...

    def release(self) -> None:
        """Give a fully read connection back to the pool."""
        ...


class UpstreamClient(Protocol):
    async def post(self, url: str, body: bytes, headers: dict[str, str]) -> UpstreamResponse: ...

    async def get(self, url: str, timeout_s: float) -> tuple[int, bytes]: ...

    async def close(self) -> None: ...
