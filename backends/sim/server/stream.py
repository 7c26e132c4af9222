"""What the step loop hands each request: tokens go straight to the client's socket.

A streaming request attaches an SseWriter once its response headers are out; from
then on the step loop writes each token's pre-encoded SSE event (HTTP/1.1 chunk
framed) to the transport itself: no task switch per token. A non-streaming request
collects tokens. Either way the handler awaits one Future: the finish reason. A request
with several choices (choices.py) has a sink and a writer per choice, one Future for all.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from backends.sim.engine.sequence import Sequence
from backends.sim.server.sse import ResponseBuilder


class Group(Protocol):
    """The request's choices together (choices.Choices): told when one of them closes."""

    def closed(self, finish_reason: str) -> None: ...


class Transport(Protocol):
    def write(self, data: bytes) -> None: ...
    def is_closing(self) -> bool: ...


class SseWriter:
    __slots__ = ("builder", "chunked", "frames", "opener", "transport")

    def __init__(self, transport: Transport, builder: ResponseBuilder, chunked: bool) -> None:
        self.transport = transport
        self.builder = builder
        self.chunked = chunked
        # a chat stream's role chunk goes out with the first token, as vLLM sends it: no
        # event may leave before the first token exists (clients time TTFT by the first)
        self.opener = builder.first_chunk()
        # a plain mid-stream token's framed event depends only on the token: build each once
        # (not with reasoning: a token's event then depends on its place, reasoning or answer)
        plain = not builder.request.continuous_usage and not builder.num_reasoning
        self.frames: dict[int, bytes] | None = {} if plain else None

    def send_one(self, token: int, num_before: int, finish_reason: str | None, num_cached: int) -> bool:
        """The step loop's hot path: one token, usually mid-stream."""
        frames = self.frames
        if frames is None or finish_reason is not None or self.opener:
            return self.send([token], num_before, finish_reason, num_cached)
        if self.transport.is_closing():
            return False
        frame = frames.get(token)
        if frame is None:
            frame = frames[token] = self._frame(self.builder.token_chunks([token], num_before, None))
        self.transport.write(frame)
        return True

    def _frame(self, data: bytes) -> bytes:
        return b"%x\r\n%b\r\n" % (len(data), data) if self.chunked else data

    def send(self, tokens: list[int], num_before: int, finish_reason: str | None, num_cached: int) -> bool:
        """Write the events for tokens; False when the client has gone away."""
        if self.transport.is_closing():
            return False
        data = self.builder.token_chunks(tokens, num_before, finish_reason)
        if finish_reason is not None:
            data += self.end(finish_reason, num_before + len(tokens), num_cached, bool(tokens))
        if self.opener:
            data = self.open() + data
        self.transport.write(self._frame(data))
        return True

    def open(self) -> bytes:
        """What goes before the first token (a chat stream's role chunk), once."""
        opener, self.opener = self.opener, b""
        return opener

    def end(self, finish_reason: str, num_completion: int, num_cached: int, sent_final: bool) -> bytes:
        """What follows the last token: the finish chunk if the token did not carry it, usage, [DONE]."""
        return self.builder.end_chunks(finish_reason, num_completion, num_cached, sent_final)


class TokenSink:
    __slots__ = (
        "done",
        "finish_reason",
        "first_token_s",
        "group",
        "last_token_s",
        "num_sent",
        "seq",
        "tokens",
        "writer",
    )

    def __init__(self, seq: Sequence) -> None:
        self.seq = seq
        self.tokens: list[int] = []  # not yet written (non-streaming: all of them)
        self.num_sent = 0
        self.finish_reason: str | None = None
        self.first_token_s: float | None = None
        self.last_token_s = 0.0
        self.writer: SseWriter | None = None
        self.group: Group | None = None  # the request's other choices, when it has several
        self.done: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    def push(self, token: int, finish_reason: str | None) -> bool:
        """Deliver one token; False when the client is gone (the caller aborts)."""
        writer = self.writer
        if writer is None:
            self.tokens.append(token)
        else:
            if not writer.send_one(token, self.num_sent, finish_reason, self.seq.num_cached_tokens):
                return False
            self.num_sent += 1
        if finish_reason is not None:
            self.close(finish_reason)
        return True

    def attach(self, writer: SseWriter) -> bool:
        """Start streaming: write what piled up, then every token as it comes."""
        self.writer = writer
        pending, self.tokens = self.tokens, []
        if pending or self.finish_reason is not None:
            if not writer.send(pending, self.num_sent, self.finish_reason, self.seq.num_cached_tokens):
                return False
            self.num_sent += len(pending)
        return True

    def close(self, finish_reason: str) -> None:
        self.finish_reason = finish_reason
        if not self.done.done():
            self.done.set_result(finish_reason)
            if self.group is not None:
                self.group.closed(finish_reason)
