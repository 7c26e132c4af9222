"""What the step loop hands to one request's HTTP handler: a cheap token channel."""

from __future__ import annotations

import asyncio

from backends.sim.sequence import Sequence


class TokenSink:
    """Tokens pile up here each step; the handler takes all that are pending at once.
    One Future at most is alive per waiting handler; push() costs an append."""

    __slots__ = ("_waiter", "finish_reason", "first_token_s", "last_token_s", "num_sent", "seq", "tokens")

    def __init__(self, seq: Sequence) -> None:
        self.seq = seq
        self.tokens: list[int] = []
        self.finish_reason: str | None = None
        self.first_token_s: float | None = None
        self.last_token_s = 0.0
        self.num_sent = 0
        self._waiter: asyncio.Future[None] | None = None

    def push(self, token: int, finish_reason: str | None) -> None:
        self.tokens.append(token)
        if finish_reason is not None:
            self.finish_reason = finish_reason
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def close(self, finish_reason: str) -> None:
        self.finish_reason = finish_reason
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def take(self) -> tuple[list[int], str | None]:
        """Wait until there is a token or the end; return the pending tokens and the
        finish reason (None while more are coming)."""
        while not self.tokens and self.finish_reason is None:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        tokens, self.tokens = self.tokens, []
        self.num_sent += len(tokens)
        return tokens, self.finish_reason
