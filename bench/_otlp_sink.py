"""An OTLP/HTTP trace sink for bench/gateway_overhead.py's `traced` target: POST /v1/traces is read
and answered 200 (an empty ExportTraceServiceResponse), the spans dropped. Its own process, so its
CPU is not the gateway's (the bench prints it apart, as it does redis-server's).

    python -m bench._otlp_sink --port N
"""

from __future__ import annotations

import argparse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Sink(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as a collector

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--port", type=int, required=True)
    args = p.parse_args()
    ThreadingHTTPServer(("127.0.0.1", args.port), Sink).serve_forever()


if __name__ == "__main__":
    main()
