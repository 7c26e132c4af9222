"""The HTTP client to the backends (aiohttp), behind a small interface tests may replace."""

from __future__ import annotations

from typing import Protocol

import aiohttp


class UpstreamError(Exception):
    """The backend could not be reached or broke the connection; `reason` is a short label."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class UpstreamResponse(Protocol):
    status: int
    content_type: str

    async def read_chunk(self) -> bytes:
        """The next bytes as they arrive; b"" at the end. Raises UpstreamError if the connection breaks."""
        ...

    async def read_all(self) -> bytes: ...

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


class _AiohttpResponse:
    __slots__ = ("_resp", "content_type", "status")

    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self._resp = resp
        self.status = resp.status
        self.content_type = resp.headers.get("Content-Type", "application/json")

    async def read_chunk(self) -> bytes:
        try:
            return await self._resp.content.readany()
        except (aiohttp.ClientError, OSError) as exc:
            raise UpstreamError("broken", str(exc) or type(exc).__name__) from None

    async def read_all(self) -> bytes:
        try:
            return await self._resp.read()
        except (aiohttp.ClientError, OSError) as exc:
            raise UpstreamError("broken", str(exc) or type(exc).__name__) from None

    def close(self) -> None:
        self._resp.close()

    def release(self) -> None:
        self._resp.release()


class AiohttpUpstream:
    """One connection pool for all backends; connect timeout from [gateway].connect_timeout_s."""

    def __init__(self, connect_timeout_s: float, max_connections_per_backend: int = 0) -> None:
        self._connect_timeout_s = connect_timeout_s
        self._limit_per_host = max_connections_per_backend
        self._session: aiohttp.ClientSession | None = None

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=0, limit_per_host=self._limit_per_host, keepalive_timeout=30)
            timeout = aiohttp.ClientTimeout(total=None, sock_connect=self._connect_timeout_s)
            self._session = aiohttp.ClientSession(connector=connector, timeout=timeout, auto_decompress=False)
        return self._session

    async def post(self, url: str, body: bytes, headers: dict[str, str]) -> UpstreamResponse:
        try:
            resp = await self._open().post(url, data=body, headers=headers)
        except aiohttp.ClientConnectorError as exc:
            raise UpstreamError("connect", str(exc)) from None
        except (TimeoutError, aiohttp.ServerTimeoutError) as exc:
            raise UpstreamError("connect", f"no connection within {self._connect_timeout_s} s ({exc})") from None
        except (aiohttp.ClientError, OSError) as exc:
            raise UpstreamError("broken", str(exc) or type(exc).__name__) from None
        return _AiohttpResponse(resp)

    async def get(self, url: str, timeout_s: float) -> tuple[int, bytes]:
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        async with self._open().get(url, timeout=timeout) as resp:
            return resp.status, await resp.read()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
