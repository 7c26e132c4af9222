"""One request's relay to a backend: retries and failover before the first byte, the stream's hot path,
the client's side, SSE usage, charging, non-streamed answers put together, continuation."""
