"""One request's exchange with its client, as the proxy (client side), the relay (backend side)
and the pipe (a stream's body) share it: what has been sent, when, and what it cost."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.endpoints.request import Call
    from gateway.observe.trace_context import Marks, Trace
    from gateway.tenants.auth import Principal

SSE_HEADERS = [
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


@dataclass
class Reply:
    """What goes to the client first: the status and headers, and the whole body when the answer
    is not a stream (body None: the stream's bytes follow)."""

    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes | None = None


def json_reply(status: int, body: bytes, extra: list[tuple[bytes, bytes]] | None = None) -> Reply:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    return Reply(status, headers + extra if extra else headers, body)


OVERHEAD_HEADER = b"x-zerogap-overhead-ms"
REQUEST_ID_HEADER = b"x-request-id"


@dataclass(slots=True)
class Attempt:
    """One try at a backend (the first, a retry before the first byte, or a continuation of a broken
    stream), as the spans and the request log tell it. Times are time.monotonic()."""

    backend: str
    kind: str  # "first" | "retry" | "continuation"
    route_s: float  # routing began
    routed_s: float  # the backend was chosen
    reason: str  # the policy's reason (affinity, balance, no_match; "" for policies that give none)
    span_id: int = 0  # its span (traced requests): the traceparent sent upstream names it
    sent_s: float | None = None  # the request went upstream
    head_s: float | None = None  # the backend's answer began (a stream's headers; a whole answer's body)
    status: int | None = None  # the backend's HTTP status
    first_s: float | None = None  # its first bytes went to the client
    end_s: float | None = None
    outcome: str = ""  # "ok", or what failed (upstream_errors_total's status label, "broken", "idle", ...)


@dataclass(slots=True)
class Charge:
    """What one request is charged (usage, tpm, token metrics): the backend's own figures when it
    reported them (exact), else the completion tokens counted from the relayed chunks and the
    prompt estimated from its bytes (see gateway/relay/charging.py)."""

    prompt_tokens: int
    completion_tokens: int
    exact: bool


@dataclass
class Exchange:
    """One request's state, filled in as it goes and read in the relay's `finally` (metrics, usage)."""

    who: Principal
    call: Call
    estimate: int  # tokens reserved against the key's tpm limit
    t0_s: float = field(default_factory=time.monotonic)
    status: int = 502
    backend: str = "none"
    started: bool = False  # status and headers went to the client
    first_s: float | None = None
    last_s: float | None = None
    charge: Charge | None = None  # None: nothing to charge (no answer came, or the backend refused it)
    replied: bool = False  # the relay has its answer (no more keep-alives while waiting for it)
    continue_ok: bool = True  # the client did not opt out of stream continuation (X-Zerogap-Continue: off)
    request_id: str = ""  # x-request-id: the client's, or made at arrival (gateway/trace_context.py)
    trace: Trace | None = None  # tracing on: the request's trace (recorded if trace.sampled)
    traceparent: str | None = None  # tracing off: the client's traceparent, passed upstream as it is
    marks: Marks | None = None  # its admission's times (the spans)
    attempts: list[Attempt] = field(default_factory=list)
    overhead_ms: float | None = None  # the gateway's own time before the head went (x-zerogap-overhead-ms)
    error: str | None = None  # what failed, in a word (the request log's error, the span's error.type)
    finish_reasons: list[str] | None = None  # traced requests: the answer's finish reasons, where known
    client: str | None = None  # the client's address (with a request log or traces)
    routing: str = ""  # the pool's routing policy

    def attempt(self, backend: str, route_s: float, reason: str, continuing: bool) -> Attempt:
        """A new try at `backend`, routed since route_s."""
        kind = "continuation" if continuing else "retry" if self.attempts else "first"
        a = Attempt(backend, kind, route_s, time.monotonic(), reason)
        if self.trace is not None and self.trace.sampled:
            a.span_id = self.trace.new_span_id()
        self.attempts.append(a)
        return a

    def upstream_headers(self, headers: dict[str, str]) -> None:
        """The request id and the trace context for the attempt about to be sent; marks it sent."""
        if self.request_id:
            headers["X-Request-Id"] = self.request_id
        trace = self.trace
        a = self.attempts[-1] if self.attempts else None
        if trace is not None:
            headers["traceparent"] = trace.traceparent(a.span_id if a is not None and a.span_id else trace.span_id)
            if trace.tracestate:
                headers["tracestate"] = trace.tracestate
        elif self.traceparent is not None:
            headers["traceparent"] = self.traceparent
        if a is not None:
            a.sent_s = time.monotonic()

    def stream_began(self, at_s: float) -> None:
        """The current attempt's stream reached the client at at_s: the answer is under way (its TTFT,
        unless this attempt continues a broken stream; no more keep-alives)."""
        if self.first_s is None:
            self.first_s = at_s
        if self.attempts:
            self.attempts[-1].first_s = at_s
        self.status = 200
        self.replied = True

    def overhead(self, head_s: float, answer_s: float | None = None) -> float:
        """ms the request spent in the gateway before its head went at head_s: the time since it
        arrived less the time each attempt waited on its backend (the current one until answer_s,
        when its answer came, or until head_s: a keep-alive sent the head while it waited)."""
        waited = 0.0
        for a in self.attempts:
            if a.sent_s is not None:
                end = a.end_s if a.end_s is not None else answer_s if answer_s is not None else head_s
                waited += max(0.0, end - a.sent_s)
        self.overhead_ms = max(0.0, head_s - self.t0_s - waited) * 1000.0
        return self.overhead_ms

    def answer_headers(self, answer_s: float | None = None) -> list[tuple[bytes, bytes]]:
        """x-request-id and x-zerogap-overhead-ms, for the head that goes now."""
        overhead = self.overhead(time.monotonic(), answer_s)
        return [(REQUEST_ID_HEADER, self.request_id.encode()), (OVERHEAD_HEADER, b"%.3f" % overhead)]

    def stream_headers(self, answer_s: float | None = None) -> list[tuple[bytes, bytes]]:
        return SSE_HEADERS + self.answer_headers(answer_s)

    def start_stream(self) -> bool:
        """Marks the response started as an SSE stream; True if the caller is to send the headers
        (nobody has yet: the client side's keep-alive or the relay's first chunk, whichever is first)."""
        if self.started:
            return False
        self.started = True
        return True
