"""What the gateway tells about a POST /tokenize or /detokenize (gateway/endpoints/tokenize.py): its ids
(the completions' `x-request-id` and trace, gateway/observe/trace_context.py), the request id and the
trace context sent to the backend, the gateway's own time on the answer, and when it is over its request
log line and, traced and sampled, its spans:

    tokenize {model}      SERVER  arrival -> end; key name, backend, status, the limit that refused it
      admission                   auth, limits, body (gateway/observe/spans.py's admission_spans)
      upstream            CLIENT  sent to the backend -> its answer (the engine's spans are its children)
"""

from __future__ import annotations

import time
from typing import Any

from gateway.observe.request_log import utc_iso
from gateway.observe.spans import Attributes, SpanSpec, admission_spans
from gateway.observe.trace_context import Marks
from gateway.server.errors import LIMIT_OF_CODE


class TokenizeCall:
    """One /tokenize or /detokenize request as it went: its labels, its answer, when it went upstream."""

    __slots__ = ("answered_s", "backend", "error", "key", "marks", "model", "path", "sent_s", "span_id", "status")

    def __init__(self, marks: Marks, path: str) -> None:
        self.marks = marks
        self.path = path  # "/tokenize" or "/detokenize"
        self.key = self.model = self.backend = "none"
        self.status = 0
        self.error: str | None = None
        self.sent_s: float | None = None  # the request went to the backend
        self.answered_s: float | None = None  # the backend's whole answer was read
        trace = marks.trace
        self.span_id = trace.new_span_id() if trace is not None and trace.sampled else 0  # the upstream span

    def upstream_headers(self, headers: dict[str, str]) -> None:
        """The request id and the trace context for the backend (vLLM's spans join the trace); marks it sent."""
        marks = self.marks
        if marks.request_id:
            headers["X-Request-Id"] = marks.request_id
        trace = marks.trace
        if trace is not None:
            headers["traceparent"] = trace.traceparent(self.span_id or trace.span_id)
            if trace.tracestate:
                headers["tracestate"] = trace.tracestate
        elif marks.traceparent is not None:
            headers["traceparent"] = marks.traceparent
        self.sent_s = time.monotonic()

    def waited_s(self) -> float:
        """The time spent waiting on the backend (not the gateway's own)."""
        if self.sent_s is None:
            return 0.0
        return (self.answered_s if self.answered_s is not None else time.monotonic()) - self.sent_s

    def answer_headers(self) -> dict[str, str]:
        """x-request-id and x-zerogap-overhead-ms, for the answer that goes now."""
        overhead_ms = 1000.0 * (time.monotonic() - self.marks.t0_s - self.waited_s())
        return {"x-request-id": self.marks.request_id, "x-zerogap-overhead-ms": f"{overhead_ms:.3f}"}


def tokenize_line(call: TokenizeCall, client: str | None, end_s: float) -> dict[str, Any]:
    """The request log line (the completions' fields; no tokens are charged, none is streamed)."""
    marks, trace = call.marks, call.marks.trace
    return {
        "time": utc_iso(time.time() - (end_s - marks.t0_s)),
        "request_id": marks.request_id,
        "key": call.key,
        "model": call.model,
        "engine": call.backend,
        "status": call.status,
        "error": call.error,
        "prompt_tokens": 0,
        "completion_tokens": 0,
        "ttft_ms": None,
        "duration_ms": round(1000.0 * (end_s - marks.t0_s), 3),
        "overhead_ms": round(1000.0 * (end_s - marks.t0_s - call.waited_s()), 3),
        "retries": 0,
        "continuations": 0,
        "finish_reasons": None,
        "client": client,
        "path": call.path,
        "stream": None,
        "trace_id": trace.trace_hex if trace is not None and trace.sampled else None,
    }


def tokenize_spans(call: TokenizeCall, client: str | None, end_s: float) -> list[SpanSpec]:
    marks, trace = call.marks, call.marks.trace
    assert trace is not None
    attrs: Attributes = {
        "gen_ai.request.model": call.model,
        "http.request.method": "POST",
        "url.path": call.path,
        "http.response.status_code": call.status,
        "zerogap.request_id": marks.request_id,
        "zerogap.key.name": call.key,
        "zerogap.backend": call.backend,
    }
    if client:
        attrs["client.address"] = client
    if call.error:
        attrs["error.type"] = call.error
        if call.error in LIMIT_OF_CODE:
            attrs["zerogap.limit"] = LIMIT_OF_CODE[call.error]
    failed = call.error or str(call.status)
    root = SpanSpec(f"{call.path.lstrip('/')} {call.model}", trace.span_id, trace.parent_id, marks.t0_s, end_s, attrs,
                    "server", failed if call.status >= 500 else None)  # fmt: skip
    refused = failed if call.error and call.sent_s is None else ""  # refused at its admission
    spans = [root, *admission_spans(trace, marks, call.key, root, False, refused)]
    if call.sent_s is not None and call.span_id:
        up: Attributes = {"zerogap.backend": call.backend, "zerogap.attempt": 0, "zerogap.attempt.kind": "first",
                          "zerogap.attempt.outcome": "ok" if call.answered_s is not None else failed}  # fmt: skip
        if call.answered_s is not None:
            up["http.response.status_code"] = call.status
        else:
            up["error.type"] = failed
        answered_s = call.answered_s if call.answered_s is not None else end_s
        spans.append(SpanSpec("upstream", call.span_id, root.span_id, call.sent_s, answered_s, up, "client",
                              None if call.answered_s is not None else failed))  # fmt: skip
    return spans
