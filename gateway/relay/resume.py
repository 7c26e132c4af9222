"""A broken stream's way on: whether it may be continued, the body that continues it, and the
metrics of what came of it (the continuation itself: gateway/relay/continuation.py; the relay's loop
tries the next backend with `Resume.body`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Literal

from gateway.relay.continuation import Rewriter, chat_call, continued_body

if TYPE_CHECKING:
    from gateway.endpoints.request import Call
    from gateway.observe.metrics import GatewayMetrics
    from gateway.pool.flights import Flight
    from gateway.relay.sse import SseFilter

BodyFor = Callable[[str | None], bytes]  # the body for a backend that serves the model under this name
Verdict = Literal["error", "continue", "done"]
DONE_EVENT = b"data: [DONE]\n\n"


class Resume:
    """One request's continuation state, across its attempts."""

    __slots__ = ("allowed", "body", "broken", "call", "failure")

    def __init__(self, call: Call, allowed: bool) -> None:
        self.call = call
        self.allowed = allowed  # [gateway].continue_streams, no opt-out header, a shape that can be continued
        self.broken: str | None = None  # why the stream broke, while a continuation is sought
        self.failure: tuple[int, bytes] | None = None  # the break's status and error event, if none can go on
        self.body: BodyFor | None = None  # the next attempt's body (None: the request's own)

    def unfinished(self, filt: SseFilter) -> bool:
        """A stream that ended cleanly but before its answer did (no finish_reason, no [DONE])."""
        t = filt.transcript
        return self.allowed and t is not None and not t.finished and not t.done

    def broke(
        self, flight: Flight, idle: bool, filt: SseFilter, event: bytes, status: int, m: GatewayMetrics
    ) -> Verdict:
        """The stream broke after its first byte: end it with its error event, go on elsewhere, or
        (its last token and finish_reason came already) end it with [DONE]."""
        reason = flight.stop or ("idle" if idle else "broken")
        t = filt.transcript
        if t is not None and t.finished:
            return "done"
        if not self.allowed or t is None or not t.ok or flight.stop == "draining":
            m.continuations.labels(self.call.model, reason, "not_continued").inc()
            return "error"
        self.broken, self.failure = reason, (status, event)
        return "continue"

    def prepare(self, filt: SseFilter) -> bool:
        """Set up the next attempt to continue the stream; False if it cannot be (its text did not
        decode, or no token of its budget is left)."""
        t = filt.transcript
        assert t is not None
        text, head = t.text(), t.head()
        if text is None or head is None:
            return False
        prompt, completion = filt.reported()
        relayed = completion if completion is not None else filt.num_chunks
        call = self.call
        as_asked = continued_body(call, text, relayed, None)
        if as_asked is None:
            return False

        def body_for(upstream_model: str | None) -> bytes:
            if not upstream_model or upstream_model == call.model:
                return as_asked  # encoded once, whichever backend of the model takes it
            body = continued_body(call, text, relayed, upstream_model)
            assert body is not None
            return body

        self.body = body_for
        filt.drop_pending()  # a partial event of the broken stream goes nowhere
        filt.rewriter = Rewriter(chat_call(call), head, prompt, relayed)
        return True

    def relayed(self, m: GatewayMetrics) -> None:
        """An attempt's first bytes went to the client: a continuation, if it was one, worked."""
        if self.broken is not None:
            m.continuations.labels(self.call.model, self.broken, "continued").inc()
            self.broken = None

    def ended(self, filt: SseFilter, m: GatewayMetrics) -> None:
        """An attempt's stream ended: count the prefill its continuation cost."""
        rewriter = filt.rewriter
        if rewriter is not None and rewriter.upstream_prompt_tokens:
            m.continuation_prompt_tokens.labels(self.call.model).inc(rewriter.upstream_prompt_tokens)
            rewriter.upstream_prompt_tokens = None

    def gave_up(self, m: GatewayMetrics) -> None:
        if self.broken is not None:
            m.continuations.labels(self.call.model, self.broken, "failed").inc()
