"""The served sim's API server (frontend.py) on the event loop: requests reach the engine,
and tokens reach their clients, when the modelled server is done with them.

Tokens wait in one queue in the order the engine made them (the server is first come,
first served, so their delivery times never go down) and one timer at a time hands out
those that are due: the order holds even where two are due at the same instant.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

from backends.sim.engine.frontend import Frontend
from backends.sim.engine.sequence import Sequence
from backends.sim.server.stream import TokenSink

Clock = Callable[[], float]
OnGone = Callable[[Sequence], None]  # a client went away while its token waited: abort it


class Outbox:
    def __init__(self, frontend: Frontend, clock: Clock, on_gone: OnGone) -> None:
        self.frontend = frontend
        self.clock = clock
        self.on_gone = on_gone
        self._tokens: deque[tuple[float, TokenSink, int, str | None]] = deque()
        self._timer: asyncio.TimerHandle | None = None
        self._parsing: dict[int, asyncio.TimerHandle] = {}

    def admit(self, seq: Sequence, enter: Callable[[Sequence], None]) -> None:
        """enter(seq) once the server has parsed the request (now, if it is idle and costs nothing)."""
        now = self.clock()
        delay = self.frontend.admit(now) - now
        if delay <= 0:
            enter(seq)
            return

        def parsed() -> None:
            del self._parsing[seq.seq_id]
            enter(seq)

        self._parsing[seq.seq_id] = asyncio.get_running_loop().call_later(delay, parsed)

    def drop(self, seq: Sequence) -> bool:
        """Forget a request still being parsed; False when it has reached the engine."""
        handle = self._parsing.pop(seq.seq_id, None)
        if handle is None:
            return False
        handle.cancel()
        return True

    def send(self, sink: TokenSink, token: int, finish_reason: str | None, made_s: float) -> None:
        self._tokens.append((self.frontend.deliver(made_s), sink, token, finish_reason))
        if self._timer is None:
            self._hand_out()

    def _hand_out(self) -> None:
        self._timer = None
        tokens = self._tokens
        now = self.clock()
        while tokens and tokens[0][0] <= now:
            _, sink, token, reason = tokens.popleft()
            if not sink.done.done() and not sink.push(token, reason):
                self.on_gone(sink.seq)
        if tokens:
            self._timer = asyncio.get_running_loop().call_later(tokens[0][0] - now, self._hand_out)

    def close(self) -> None:
        """The engine stops: every request still at the server is aborted."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for handle in self._parsing.values():
            handle.cancel()
        self._parsing.clear()
        while self._tokens:
            self._tokens.popleft()[1].close("abort")
