"""An upstream client that answers from a script, with no sockets (create_app(config, client=...)):
each POST takes the next answer of the script, whichever backend it was sent to, so a test says
what the first attempt, the second and so on get, and reads which backends the relay chose."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field

from gateway.upstream.client import UpstreamError


def chunk(i: int, prompt_tokens: int = 5, finish: str | None = None) -> bytes:
    """One vLLM-shaped chat chunk with token t{i} and its continuous usage."""
    body = {
        "id": "chatcmpl-x", "object": "chat.completion.chunk", "created": 1, "model": "m",
        "choices": [{"index": 0, "delta": {"content": f" t{i}"}, "finish_reason": finish}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": i + 1, "total_tokens": prompt_tokens + i + 1},
    }  # fmt: skip
    return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"  # compact, as vLLM writes


ROLE_CHUNK = (
    b'data: {"id":"chatcmpl-x","object":"chat.completion.chunk","created":1,"model":"m","choices":'
    b'[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}],"usage":'
    b'{"prompt_tokens":5,"completion_tokens":0,"total_tokens":5}}\n\n'
)


def stream(num_tokens: int, ends: bool = True) -> list[bytes]:
    """vLLM's chat stream: the role chunk, then num_tokens chunks; ends: the last one finishes and
    [DONE] follows."""
    chunks = [chunk(i, finish="length" if ends and i == num_tokens - 1 else None) for i in range(num_tokens)]
    return [ROLE_CHUNK, *chunks] + ([b"data: [DONE]\n\n"] if ends else [])


@dataclass
class Answer:
    """What one attempt gets: `connect` fails before any answer; otherwise `status` with `body` (one
    piece) or `chunks` (a stream), which breaks after its chunks when `breaks`."""

    status: int = 200
    body: bytes = b""
    chunks: list[bytes] = field(default_factory=list)
    breaks: bool = False
    connect: bool = False


class ScriptedResponse:
    def __init__(self, answer: Answer) -> None:
        self.status = answer.status
        self.content_type = "text/event-stream" if answer.chunks else "application/json"
        self._pieces = list(answer.chunks) if answer.chunks else [answer.body]
        self._breaks = answer.breaks
        self.closed = self.released = False

    def _next(self) -> bytes:
        if self._pieces:
            return self._pieces.pop(0)
        if self._breaks:
            raise UpstreamError("broken", "connection reset by the script", "broke the connection")
        return b""

    async def read_chunk(self) -> bytes:
        return self._next()

    async def read_all(self) -> bytes:
        parts = []
        while piece := self._next():
            parts.append(piece)
        return b"".join(parts)

    def pipe(self, sink: Callable[[bytes], None]) -> asyncio.Future[None]:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()

        def feed() -> None:
            if done.done():
                return
            try:
                piece = self._next()
            except UpstreamError as exc:
                done.set_exception(exc)
                return
            if not piece:
                done.set_result(None)
                return
            sink(piece)
            loop.call_soon(feed)

        loop.call_soon(feed)
        return done

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True

    def release(self) -> None:
        self.released = True


class ScriptedClient:
    """POSTs answered in order from `script`; health checks and load scrapes answer 200."""

    def __init__(self, *script: Answer) -> None:
        self.script = list(script)
        self.posts: list[str] = []  # the URL of each attempt, in order
        self.bodies: list[dict[str, object]] = []

    async def post(self, url: str, body: bytes, headers: dict[str, str]) -> ScriptedResponse:
        self.posts.append(url)
        self.bodies.append(json.loads(body))
        answer = self.script.pop(0) if self.script else Answer(500, b'{"error": "the script ran out"}')
        if answer.connect:
            raise UpstreamError("connect", "connection refused by the script", "could not be reached")
        return ScriptedResponse(answer)

    async def get(self, url: str, timeout_s: float) -> tuple[int, bytes]:
        return 200, b""

    async def close(self) -> None:
        pass
