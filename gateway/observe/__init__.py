"""What the gateway tells: Prometheus metrics, each request's ids, request log line and spans,
OpenTelemetry export, the TPS log line, client-caused log lines throttled."""
