"""What the gateway tells about each completion request: its ids at arrival (`begin`), and when
it has ended, its request log line and, if it is traced and sampled, its spans (`ended`,
`refused`). With [observability] and [logging].request_log off, `begin` reads the request id and
nothing else, and the rest returns at once.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from gateway.observe.spans import Refusal, refusal_spans, request_spans
from gateway.observe.trace_context import Marks, TraceStarter, incoming, plain_traceparent, request_id_of
from gateway.server.asgi import Scope, client_host

if TYPE_CHECKING:
    from common.config import Config
    from gateway.observe.request_log import RequestLog
    from gateway.observe.tokenize_story import TokenizeCall
    from gateway.observe.tracing import Tracing
    from gateway.relay.exchange import Exchange
    from gateway.server.errors import ApiError

log = logging.getLogger("zerogap.gateway.observe")


class Observer:
    def __init__(self, config: Config) -> None:
        self.config = config
        obs = config.observability
        self.starter = TraceStarter(obs.sample_ratio, obs.continue_client_trace) if obs.enabled else None
        self.tracing: Tracing | None = None  # made at start (its export thread belongs to the serving process)
        self.log: RequestLog | None = None
        self.active = False  # a request log or traces: something to do when a request ends

    def start(self) -> None:
        obs, logs = self.config.observability, self.config.logging
        if obs.enabled:
            from gateway.observe.tracing import Tracing

            self.tracing = Tracing(obs)
        if logs.request_log != "off":
            from gateway.observe.request_log import RequestLog

            self.log = RequestLog.open(logs.request_log, self.config.resolve_path, logs.request_log_max_mb,
                                       logs.request_log_keep)  # fmt: skip
        self.active = self.tracing is not None or self.log is not None

    def stop(self) -> None:
        self.active = False
        if self.tracing is not None:
            self.tracing.shutdown()  # what is queued is sent first
        if self.log is not None:
            self.log.close()

    def begin(self, scope: Scope, marks: Marks) -> None:
        """The request's id and trace, from its headers."""
        request_id, traceparent, tracestate = incoming(scope)
        marks.request_id = request_id_of(request_id)
        if self.starter is not None:
            marks.trace = self.starter.start(traceparent, tracestate)
        elif traceparent is not None:
            marks.traceparent = plain_traceparent(traceparent)

    def admitted(self, scope: Scope, marks: Marks, exchange: Exchange) -> None:
        exchange.request_id = marks.request_id
        exchange.trace = marks.trace
        exchange.traceparent = marks.traceparent
        exchange.marks = marks
        if self.active:
            exchange.client = client_host(scope)

    def ended(self, exchange: Exchange, prompt: int, completion: int) -> None:
        """The request is over (the relay's finally, after it was charged)."""
        if not self.active:
            return
        end_s = time.monotonic()
        try:
            if self.log is not None:
                self.log.write(log_line(exchange, prompt, completion, end_s))
            trace = exchange.trace
            if self.tracing is not None and trace is not None and trace.sampled:
                spans = request_spans(exchange, prompt, completion, end_s)
                self.tracing.record(trace.trace_id, trace.tracestate, spans)
        except Exception:  # telemetry never fails a request
            log.exception("could not record request %s", exchange.request_id)

    def refused(self, scope: Scope, marks: Marks, key: str, model: str, exc: ApiError, path: str) -> None:
        """A request refused at its admission; `key` and `model` as far as they are known (labels)."""
        if not self.active:
            return
        end_s = time.monotonic()
        refusal = Refusal(key, model, exc.status, exc.code, path)
        try:
            if self.log is not None:
                self.log.write(refusal_line(scope, marks, refusal, end_s))
            trace = marks.trace
            if self.tracing is not None and trace is not None and trace.sampled:
                spans = refusal_spans(marks, refusal, end_s)
                self.tracing.record(trace.trace_id, trace.tracestate, spans)
        except Exception:
            log.exception("could not record request %s", marks.request_id)

    def tokenized(self, scope: Scope, call: TokenizeCall) -> None:
        """A /tokenize or /detokenize request is over: answered, refused or failed."""
        if not self.active:
            return
        from gateway.observe.tokenize_story import tokenize_line, tokenize_spans

        end_s = time.monotonic()
        client = client_host(scope)
        try:
            if self.log is not None:
                self.log.write(tokenize_line(call, client, end_s))
            trace = call.marks.trace
            if self.tracing is not None and trace is not None and trace.sampled:
                self.tracing.record(trace.trace_id, trace.tracestate, tokenize_spans(call, client, end_s))
        except Exception:
            log.exception("could not record request %s", call.marks.request_id)


def _wall(monotonic_s: float, end_s: float) -> float:
    return time.time() - (end_s - monotonic_s)


def log_line(exchange: Exchange, prompt: int, completion: int, end_s: float) -> dict[str, Any]:
    from gateway.observe.request_log import utc_iso

    first_s = exchange.first_s
    trace = exchange.trace
    return {
        "time": utc_iso(_wall(exchange.t0_s, end_s)),
        "request_id": exchange.request_id,
        "key": exchange.who.name,
        "model": exchange.call.model,
        "engine": exchange.backend,
        "status": exchange.status,
        "error": exchange.error,
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "ttft_ms": None if first_s is None else round(1000.0 * (first_s - exchange.t0_s), 3),
        "duration_ms": round(1000.0 * (end_s - exchange.t0_s), 3),
        "overhead_ms": None if exchange.overhead_ms is None else round(exchange.overhead_ms, 3),
        "retries": sum(1 for a in exchange.attempts if a.kind == "retry"),
        "continuations": sum(1 for a in exchange.attempts if a.kind == "continuation"),
        "finish_reasons": exchange.finish_reasons,
        "client": exchange.client,
        "path": exchange.call.path,
        "stream": exchange.call.stream,
        "trace_id": trace.trace_hex if trace is not None and trace.sampled else None,
    }


def refusal_line(scope: Scope, a: Marks, r: Refusal, end_s: float) -> dict[str, Any]:
    from gateway.observe.request_log import utc_iso

    trace = a.trace
    return {
        "time": utc_iso(_wall(a.t0_s, end_s)),
        "request_id": a.request_id,
        "key": r.key,
        "model": r.model,
        "engine": "none",
        "status": r.status,
        "error": r.code or str(r.status),
        "prompt_tokens": 0,
        "completion_tokens": 0,
        "ttft_ms": None,
        "duration_ms": round(1000.0 * (end_s - a.t0_s), 3),
        "overhead_ms": round(1000.0 * (end_s - a.t0_s), 3),
        "retries": 0,
        "continuations": 0,
        "finish_reasons": None,
        "client": client_host(scope),
        "path": r.path,
        "stream": None,
        "trace_id": trace.trace_hex if trace is not None and trace.sampled else None,
    }
