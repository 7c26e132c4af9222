"""The OpenTelemetry SDK's side of the gateway's traces ([observability]): the OTLP exporter
(http/protobuf or grpc), a BatchSpanProcessor (its own thread: encoding and sending stay off the
event loop; a full queue drops spans, never waits) and the conversion of a request's `SpanSpec`s
(gateway/observe/spans.py) into SDK spans with the ids the request used upstream and explicit start and
end times. Imported only when `otlp_endpoint` is set: with tracing off no OpenTelemetry module is
loaded at all.

The SDK's tracer would choose span ids itself as each span starts; the gateway must name a span's
id in the traceparent it sends upstream before that span ends, and builds its spans only when the
request is over. So it makes `ReadableSpan`s itself (the SDK's own span record, what the tracer
would hand the processor) and samples as ParentBased(TraceIdRatioBased) would
(gateway/observe/trace_context.py).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState

from common import __version__
from common.config.observability import ObservabilitySection
from gateway.observe.spans import SpanSpec

log = logging.getLogger("zerogap.gateway.tracing")

KINDS = {"server": SpanKind.SERVER, "client": SpanKind.CLIENT, "internal": SpanKind.INTERNAL}
SAMPLED = TraceFlags(TraceFlags.SAMPLED)


def exporter(section: ObservabilitySection) -> SpanExporter:
    headers = dict(section.otlp_headers) or None
    if section.otlp_protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

        url = section.traces_url()
        return GrpcExporter(
            endpoint=url, insecure=url.startswith("http://"), headers=headers, timeout=section.export_timeout_s
        )
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

    return HttpExporter(endpoint=section.traces_url(), headers=headers, timeout=section.export_timeout_s)


class Tracing:
    """Spans out of this process, in batches, to [observability].otlp_endpoint."""

    def __init__(self, section: ObservabilitySection, span_exporter: SpanExporter | None = None) -> None:
        self.resource = Resource.create(
            {"service.name": section.service_name, "service.version": __version__, "process.pid": os.getpid()}
        )
        self.scope = InstrumentationScope("zerogap.gateway", __version__)
        self.processor = BatchSpanProcessor(span_exporter or exporter(section))
        log.info("traces go to %s (%s), %g of new traces sampled", section.traces_url(), section.otlp_protocol,
                 section.sample_ratio)  # fmt: skip

    def record(self, trace_id: int, tracestate: str | None, specs: Sequence[SpanSpec]) -> None:
        """The request's spans, converted from time.monotonic() to the wall clock, to the exporter's queue."""
        offset_ns = time.time_ns() - time.monotonic_ns()
        state = TraceState.from_header([tracestate]) if tracestate else None
        for spec in specs:
            context = SpanContext(trace_id, spec.span_id, False, SAMPLED, state)
            parent = SpanContext(trace_id, spec.parent_id, spec.parent_id is not None and spec is specs[0], SAMPLED,
                                 state) if spec.parent_id else None  # fmt: skip
            status = Status(StatusCode.ERROR, spec.error) if spec.error else Status(StatusCode.UNSET)
            events = [Event(name, attrs, _ns(at_s, offset_ns)) for name, at_s, attrs in spec.events]
            span = ReadableSpan(
                name=spec.name,
                context=context,
                parent=parent,
                resource=self.resource,
                attributes=spec.attributes,
                events=events,
                kind=KINDS[spec.kind],
                status=status,
                start_time=_ns(spec.start_s, offset_ns),
                end_time=_ns(max(spec.end_s, spec.start_s), offset_ns),
                instrumentation_scope=self.scope,
            )
            self.processor.on_end(span)

    def flush(self, timeout_s: float = 10.0) -> bool:
        return bool(self.processor.force_flush(int(timeout_s * 1000)))

    def shutdown(self) -> None:
        self.processor.shutdown()


def _ns(monotonic_s: float, offset_ns: int) -> int:
    return int(monotonic_s * 1e9) + offset_ns
