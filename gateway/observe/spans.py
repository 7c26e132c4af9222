"""A traced request's spans, built when it has ended from what the request recorded on its way
(the admission's times, each attempt's, the first byte's, the charge): nothing is made while it
runs but a few timestamps. Plain data here (`SpanSpec`); gateway/observe/tracing.py hands them to the
OpenTelemetry SDK.

    chat {model}          SERVER  arrival -> end; GenAI attributes, key name, TTFT, overhead, status
      admission                   arrival -> admitted or refused (zerogap.limit: the limit that refused)
        auth                      the key
        limits                    rpm and max_concurrency, at the headers
        body                      read and parsed
        tpm                       the tpm reservation (keys with tpm)
      route                       per attempt: policy, reason, backend
      upstream                CLIENT per attempt: backend, kind (first, retry, continuation), status;
                                  vLLM's spans are its children (the traceparent sent names it)
      first_byte                  arrival -> the first bytes to the client (TTFT)
      stream                      the first bytes -> the stream's end: tokens, finish reasons, outcome
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gateway.server.errors import LIMIT_OF_CODE

if TYPE_CHECKING:
    from gateway.observe.trace_context import Marks, Trace
    from gateway.relay.exchange import Exchange

Attributes = dict[str, Any]


@dataclass(slots=True)
class SpanSpec:
    name: str
    span_id: int
    parent_id: int | None
    start_s: float  # time.monotonic()
    end_s: float
    attributes: Attributes
    kind: str = "internal"  # "server" | "client" | "internal"
    error: str | None = None  # the span's status is ERROR, with this description
    events: list[tuple[str, float, Attributes]] = field(default_factory=list)


@dataclass(slots=True)
class Refusal:
    """A request refused at its admission: the labels known then, and the answer."""

    key: str
    model: str  # "none" before the body, "unknown" for a model not there or not the key's
    status: int
    code: str | None
    path: str


def operation(path: str) -> str:
    return "chat" if path.endswith("/chat/completions") else "text_completion"


def request_spans(exchange: Exchange, prompt: int, completion: int, end_s: float) -> list[SpanSpec]:
    """The spans of a request that was admitted (whatever came of it)."""
    trace, call, a = exchange.trace, exchange.call, exchange.marks
    assert trace is not None
    op = operation(call.path)
    attrs: Attributes = {
        "gen_ai.operation.name": op,
        "gen_ai.request.model": call.model,
        "gen_ai.usage.input_tokens": prompt,
        "gen_ai.usage.output_tokens": completion,
        "http.request.method": "POST",
        "url.path": call.path,
        "http.response.status_code": exchange.status,
        "zerogap.request_id": exchange.request_id,
        "zerogap.key.name": exchange.who.name,
        "zerogap.backend": exchange.backend,
        "zerogap.stream": call.stream,
        "zerogap.retries": sum(1 for x in exchange.attempts if x.kind == "retry"),
        "zerogap.continuations": sum(1 for x in exchange.attempts if x.kind == "continuation"),
    }
    if call.max_tokens is not None:
        attrs["gen_ai.request.max_tokens"] = call.max_tokens
    if call.choices_per_prompt > 1:
        attrs["gen_ai.request.choice.count"] = call.choices_per_prompt
    if exchange.finish_reasons:
        attrs["gen_ai.response.finish_reasons"] = exchange.finish_reasons
    if exchange.first_s is not None:
        attrs["zerogap.ttft_ms"] = round(1000.0 * (exchange.first_s - exchange.t0_s), 3)
    if exchange.overhead_ms is not None:
        attrs["zerogap.overhead_ms"] = round(exchange.overhead_ms, 3)
    if exchange.client:
        attrs["client.address"] = exchange.client
    if exchange.charge is not None and not exchange.charge.exact:
        attrs["zerogap.usage.estimated"] = True
    error = _error(exchange.status, exchange.error)
    if exchange.error:
        attrs["error.type"] = exchange.error
    root = SpanSpec(f"{op} {call.model}", trace.span_id, trace.parent_id, exchange.t0_s, end_s, attrs, "server", error)
    spans = [root]
    if a is not None:
        spans += admission_spans(trace, a, exchange.who.name, root, exchange.who.limits.tpm is not None)
    for i, x in enumerate(exchange.attempts):
        route = {"zerogap.route.policy": exchange.routing, "zerogap.route.reason": x.reason or exchange.routing,
                 "zerogap.backend": x.backend, "zerogap.attempt": i}  # fmt: skip
        spans.append(SpanSpec("route", trace.new_span_id(), root.span_id, x.route_s, x.routed_s, route))
        if x.sent_s is None:
            continue
        up: Attributes = {"zerogap.backend": x.backend, "zerogap.attempt": i, "zerogap.attempt.kind": x.kind,
                          "gen_ai.request.model": call.model, "zerogap.attempt.outcome": x.outcome or "ok"}  # fmt: skip
        if x.status is not None:
            up["http.response.status_code"] = x.status
        failed = x.outcome not in ("", "ok")
        if failed:
            up["error.type"] = x.outcome
        span = SpanSpec("upstream", x.span_id, root.span_id, x.sent_s, x.end_s or end_s, up, "client",
                        x.outcome if failed else None)  # fmt: skip
        if x.head_s is not None:
            span.events.append(("response_head", x.head_s, {}))
        if x.first_s is not None:
            span.events.append(("first_byte", x.first_s, {}))
        spans.append(span)
    if exchange.first_s is not None:
        ttft = {"zerogap.ttft_ms": attrs.get("zerogap.ttft_ms", 0.0)}
        spans.append(SpanSpec("first_byte", trace.new_span_id(), root.span_id, exchange.t0_s, exchange.first_s, ttft))
        if call.stream:
            stream: Attributes = {"gen_ai.usage.output_tokens": completion}
            stream["http.response.status_code"] = exchange.status
            if exchange.finish_reasons:
                stream["gen_ai.response.finish_reasons"] = exchange.finish_reasons
            stream_end = exchange.last_s if exchange.last_s is not None else end_s
            span = SpanSpec("stream", trace.new_span_id(), root.span_id, exchange.first_s, max(stream_end, end_s),
                            stream, error=error)  # fmt: skip
            span.events.append(("last_byte", stream_end, {}))
            spans.append(span)
    return spans


def admission_spans(trace: Trace, a: Marks, key: str, root: SpanSpec, tpm: bool, refused: str = "") -> list[SpanSpec]:
    done_s = a.done_s if a.done_s is not None else root.end_s
    attrs: Attributes = {"zerogap.key.name": key}
    if refused:
        attrs["error.type"] = refused
        if refused in LIMIT_OF_CODE:
            attrs["zerogap.limit"] = LIMIT_OF_CODE[refused]
    span = SpanSpec("admission", trace.new_span_id(), root.span_id, a.t0_s, done_s, attrs, error=refused or None)
    spans = [span]
    steps = [("auth", a.t0_s, a.auth_s), ("limits", a.auth_s, a.head_s), ("body", a.head_s, a.body_s)]
    if tpm:
        steps.append(("tpm", a.body_s, None if refused else done_s))
    for name, start, end in steps:
        if start is None:
            break
        failed = end is None  # the step that refused the request (or did not finish)
        spans.append(SpanSpec(name, trace.new_span_id(), span.span_id, start, done_s if end is None else end, {},
                              error=(refused or "not finished") if failed else None))  # fmt: skip
        if failed:
            break
    return spans


def refusal_spans(a: Marks, r: Refusal, end_s: float) -> list[SpanSpec]:
    """The spans of a request refused at its admission (401, 404, 429, 400, ...)."""
    trace = a.trace
    assert trace is not None
    op = operation(r.path)
    error = r.code or str(r.status)
    attrs: Attributes = {
        "gen_ai.operation.name": op,
        "gen_ai.request.model": r.model,
        "http.request.method": "POST",
        "url.path": r.path,
        "http.response.status_code": r.status,
        "zerogap.request_id": a.request_id,
        "zerogap.key.name": r.key,
        "error.type": error,
    }
    if r.code in LIMIT_OF_CODE:
        attrs["zerogap.limit"] = LIMIT_OF_CODE[r.code]
    root = SpanSpec(f"{op} {r.model}", trace.span_id, trace.parent_id, a.t0_s, end_s, attrs, "server",
                    _error(r.status, error))  # fmt: skip
    return [root, *admission_spans(trace, a, r.key, root, r.code == "rate_limit_tokens", error)]


def _error(status: int, error: str | None) -> str | None:
    """A server span is an error for 5xx (OpenTelemetry's HTTP conventions); 4xx and 499 are the client's."""
    return (error or str(status)) if status >= 500 else None
