"""A request's ids as they arrive: its request id (`x-request-id`) and its W3C trace context
(`traceparent`, `tracestate`), read from the headers in one pass, with no OpenTelemetry import.

The request id is the client's `x-request-id` when it is 1-128 characters of `A-Z a-z 0-9 - _ . : @ / + =`
(anything else is replaced, never echoed), else 32 random hex digits. It goes back to the client,
upstream (vLLM names its request after it) and into the request log and the spans.

With tracing on, `TraceStarter.start` decides the request's trace: the client's traceparent continued
(its trace id, and its sampled flag: a parent's decision is kept, as OpenTelemetry's ParentBased
sampler does), or a new trace id sampled by ratio on its low 64 bits (as TraceIdRatioBased). Each
upstream attempt gets a traceparent of its own span id, sampled or not, so that vLLM's spans join
the trace (or, unsampled, are not recorded either). With tracing off a client's valid traceparent
goes upstream unchanged, so an engine that traces still joins the client's trace.
"""

from __future__ import annotations

import os
import random
import re

from gateway.server.asgi import Scope

REQUEST_ID_MAX_CHARS = 128
_ID_CHARS = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.:@/+="
_TRACEPARENT = re.compile(rb"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-[^\s]*)?")
_TRACESTATE_MAX_BYTES = 512
_LOW64 = (1 << 64) - 1


def request_id_of(value: bytes | None) -> str:
    """The client's id if it is short and plain, else a fresh one."""
    if value and len(value) <= REQUEST_ID_MAX_CHARS and not value.translate(None, _ID_CHARS):
        return value.decode("ascii")
    return os.urandom(16).hex()


def incoming(scope: Scope) -> tuple[bytes | None, bytes | None, bytes | None]:
    """x-request-id, traceparent and tracestate, in one pass over the headers."""
    request_id = traceparent = tracestate = None
    for name, value in scope["headers"]:
        if name == b"x-request-id":
            request_id = value
        elif name == b"traceparent":
            traceparent = value
        elif name == b"tracestate":
            tracestate = value
    return request_id, traceparent, tracestate


def parse_traceparent(value: bytes | None) -> tuple[int, int, bool] | None:
    """(trace id, parent span id, sampled) of a valid W3C traceparent; None for anything else."""
    if value is None:
        return None
    match = _TRACEPARENT.fullmatch(value)
    if match is None:
        return None
    version, trace_hex, span_hex, flags, rest = match.groups()
    if version == b"ff" or (version == b"00" and rest):
        return None
    trace_id, span_id = int(trace_hex, 16), int(span_hex, 16)
    if not trace_id or not span_id:
        return None
    return trace_id, span_id, bool(int(flags, 16) & 1)


def plain_traceparent(value: bytes | None) -> str | None:
    """A client's traceparent passed on as it is (tracing off), if it is a valid one."""
    return value.decode("ascii") if value is not None and parse_traceparent(value) is not None else None


class Marks:
    """One request's ids, and when each step of its admission ended (time.monotonic(); the spans)."""

    __slots__ = ("auth_s", "body_s", "done_s", "head_s", "request_id", "t0_s", "trace", "traceparent")

    def __init__(self, t0_s: float) -> None:
        self.t0_s = t0_s
        self.request_id = ""
        self.trace: Trace | None = None  # tracing on
        self.traceparent: str | None = None  # tracing off: the client's, passed upstream as it is
        self.auth_s: float | None = None  # the key was known
        self.head_s: float | None = None  # the checks at the headers passed (rpm, concurrency)
        self.body_s: float | None = None  # the body was read and parsed
        self.done_s: float | None = None  # admitted (model, tpm), or refused


class Trace:
    """One request's trace: its ids, whether it is recorded, and the traceparent of each attempt."""

    __slots__ = ("parent_id", "sampled", "span_id", "trace_id", "tracestate")

    def __init__(self, trace_id: int, span_id: int, parent_id: int | None, sampled: bool, tracestate: str | None):
        self.trace_id = trace_id
        self.span_id = span_id  # the gateway's server span
        self.parent_id = parent_id  # the client's span, when its trace was continued
        self.sampled = sampled
        self.tracestate = tracestate

    def new_span_id(self) -> int:
        return random.getrandbits(64) or 1

    def traceparent(self, span_id: int) -> str:
        return f"00-{self.trace_id:032x}-{span_id:016x}-{'01' if self.sampled else '00'}"

    @property
    def trace_hex(self) -> str:
        return f"{self.trace_id:032x}"


class TraceStarter:
    """Decides each request's trace ([observability]: sample_ratio, continue_client_trace)."""

    __slots__ = ("bound", "continue_client")

    def __init__(self, sample_ratio: float, continue_client: bool) -> None:
        self.bound = round(sample_ratio * (1 << 64))  # OpenTelemetry's TraceIdRatioBased bound
        self.continue_client = continue_client

    def start(self, traceparent: bytes | None, tracestate: bytes | None) -> Trace:
        parent = parse_traceparent(traceparent) if self.continue_client and traceparent is not None else None
        span_id = random.getrandbits(64) or 1
        if parent is not None:
            state = tracestate.decode("latin-1") if tracestate and len(tracestate) <= _TRACESTATE_MAX_BYTES else None
            return Trace(parent[0], span_id, parent[1], parent[2], state)
        trace_id = random.getrandbits(128) or 1
        return Trace(trace_id, span_id, None, (trace_id & _LOW64) < self.bound, None)
