"""A TCP relay between the gateway and a vLLM replica that cuts one completion's connection
(an abort, as when a replica dies) once that many bytes of its answer went through: a replica
failing mid-stream, on demand, while the replica itself keeps serving the continuation."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from common.net import free_port


class CuttingProxy:
    def __init__(self, target_port: int, cut_after_bytes: int, cuts: list[int] | None = None) -> None:
        """cuts: how many connections are still to be cut, shared by the relays given the same list
        (so that whichever backend the first attempt goes to, that one is cut, and only once)."""
        self.port = free_port()
        self.target_port = target_port
        self.cut_after_bytes = cut_after_bytes
        self.cuts = cuts if cuts is not None else [1]
        self.num_cut = 0
        self.requests: list[bytes] = []  # each read that starts a request (its head and body, when small)
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None

    async def _start(self) -> None:
        self._server = await asyncio.start_server(self._client, "127.0.0.1", self.port)

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        cutting = [False]  # this connection's current request is the one to cut (its answer's bytes counted)
        sent = [0]
        forward = asyncio.ensure_future(self._copy(reader, up_writer, cutting, sent))
        try:
            while data := await up_reader.read(65536):
                if cutting[0] and sent[0] + len(data) >= self.cut_after_bytes:
                    # only the bytes up to the cut: a read that holds the whole answer (a loaded
                    # machine's) must not reach the gateway whole before the abort
                    writer.write(data[: max(0, self.cut_after_bytes - sent[0])])
                    await writer.drain()  # those bytes out before the abort (which drops what is buffered)
                    self.num_cut += 1
                    writer.transport.abort()  # the gateway sees the connection reset mid-stream
                    up_writer.transport.abort()  # and the replica sees its client go (it frees the slot)
                    return
                writer.write(data)
                sent[0] += len(data)
                await writer.drain()
        except OSError:
            pass
        finally:
            forward.cancel()
            writer.close()
            up_writer.close()

    async def _copy(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, cutting: list[bool], sent: list[int]
    ) -> None:
        """The gateway's requests to the replica, each noted (a kept-alive connection carries health
        checks and scrapes before a completion): the first completion while cuts are left is cut."""
        current: int | None = None  # this connection's request in self.requests (its body may come in more reads)
        try:
            while data := await reader.read(65536):
                if not data.startswith((b"POST ", b"GET ")) and current is not None:
                    self.requests[current] += data
                if data.startswith((b"POST ", b"GET ")):
                    current = len(self.requests)
                    self.requests.append(data)
                    sent[0] = 0
                    if self.cuts[0] > 0 and data.startswith(b"POST /v1/chat/completions"):
                        self.cuts[0] -= 1
                        cutting[0] = True
                writer.write(data)
                await writer.drain()
        except OSError:
            pass

    @contextmanager
    def running(self) -> Iterator[CuttingProxy]:
        thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        try:
            yield self
        finally:

            async def stop() -> None:
                assert self._server is not None
                self._server.close()
                for task in asyncio.all_tasks():
                    if task is not asyncio.current_task():
                        task.cancel()

            asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            thread.join(10)
            self._loop.close()
