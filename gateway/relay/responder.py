"""The client's side of an answer, as the relay sends it: the head (with the whole body of an answer
that is not a stream), a stream's body through its Pipe (which writes from the upstream's callbacks),
the bytes the relay adds itself (an error event, the end of a stream), and the body's end.

The relay calls it directly: one coroutine from the endpoint to the upstream's answer, no generator
between them that the endpoint steps and sends outcomes into."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.relay.exchange import Reply
from gateway.server.asgi import Send

if TYPE_CHECKING:
    from gateway.relay.client_side import ClientSide
    from gateway.relay.pipe import Pipe


class Responder:
    __slots__ = ("_client", "_done", "_send")

    def __init__(self, send: Send, client: ClientSide) -> None:
        self._send = send
        self._client = client
        self._done = False  # the body's last message went

    async def reply(self, answer: Reply | bytes) -> None:
        """A head (and the whole body, if the reply has one), or bytes inside a started stream."""
        if isinstance(answer, bytes):
            await self.body(answer)
            return
        await self._send({"type": "http.response.start", "status": answer.status, "headers": answer.headers})
        if answer.body is not None:
            self._client.finished = True
            self._done = True
            await self._send({"type": "http.response.body", "body": answer.body, "more_body": False})

    async def body(self, data: bytes) -> None:
        await self._send({"type": "http.response.body", "body": data, "more_body": True})

    async def pipe(self, pipe: Pipe) -> BaseException | None:
        """A stream's body, relayed until it ends (None) or breaks (what broke it)."""
        return await pipe.run(self._send)

    async def end(self) -> None:
        """The body is over: its last (empty) message, unless a whole reply went already."""
        self._client.finished = True
        if not self._done:
            self._done = True
            await self._send({"type": "http.response.body", "body": b"", "more_body": False})
