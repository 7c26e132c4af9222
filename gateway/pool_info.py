"""GET /metrics/backends: where each backend's /metrics is, for tools that read the engines'
own signals (the load-test harness's GPU utilization, running, waiting, KV cache) and should
not need their addresses written down: the gateway knows its pool.

    {"data": [{"name": "b0", "model": "m", "url": "http://10.0.0.5:8100",
               "metrics_url": "http://10.0.0.5:8100/metrics", "up": true}]}

Guarded as GET /metrics is: with [server].metrics_key set, only `Authorization: Bearer
<metrics_key>` (401 otherwise). Nothing secret is listed: never a backend's api_key, and a
URL's user:password@, query and fragment are left out."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gateway.asgi import client_host, header
from gateway.errors import ApiError
from gateway.gateway import Gateway
from gateway.pool import Backend
from zerogap.net import public_url

METRICS_KEY = "[server].metrics_key"
PATH = "/metrics/backends"


def describe(backend: Backend) -> dict[str, object]:
    """One backend as the listing shows it; its metrics URL is the one the gateway's load scrape reads."""
    url = public_url(backend.url)
    return {"name": backend.name, "model": backend.model, "url": url, "metrics_url": url + "/metrics",
            "up": backend.healthy}  # fmt: skip


async def metrics_backends(request: Request) -> Response:
    gw: Gateway = request.app.state.gateway
    key = gw.config.server.metrics_key
    if key:
        try:
            gw.auth.check_secret(header(request.scope, b"authorization"), client_host(request.scope), key, METRICS_KEY)
        except ApiError as exc:
            return JSONResponse(exc.body(), exc.status, headers=exc.headers)
    return JSONResponse({"data": [describe(backend) for backend in gw.router.backends]})
