"""GET /metrics/backends: where each backend's /metrics is, for tools that read the engines'
own signals (the load-test harness's GPU utilization, running, waiting, KV cache) and should
not need their addresses written down: the gateway knows its pool.

    {"data": [{"name": "b0", "model": "m", "url": "http://10.0.0.5:8100",
               "metrics_url": "http://10.0.0.5:8100/metrics", "up": true}]}

Guarded as GET /metrics is: with [server].metrics_key set, only `Authorization: Bearer
<metrics_key>` (401 otherwise), which sees the addresses. Without a metrics_key the listing is
open but the addresses (`url`, `metrics_url`) are null, except for a client on the gateway's own
loopback (127.0.0.1, ::1: the harness beside a gateway started from the shipped config.toml, which
listens there), who could list the host's listening sockets anyway. Nothing secret is ever
listed: never a backend's api_key, and a URL's user:password@, query and fragment are left out."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from common.net import client_ip, public_url
from gateway.gateway import Gateway
from gateway.pool.model_pool import Backend
from gateway.server.asgi import client_host, header
from gateway.server.errors import ApiError

METRICS_KEY = "[server].metrics_key"
PATH = "/metrics/backends"


def describe(backend: Backend, addresses: bool) -> dict[str, object]:
    """One backend as the listing shows it; its metrics URL is the one the gateway's load scrape reads."""
    url = public_url(backend.url) if addresses else None
    return {"name": backend.name, "model": backend.model, "url": url,
            "metrics_url": url + "/metrics" if url is not None else None, "up": backend.healthy}  # fmt: skip


def on_loopback(client: str | None) -> bool:
    """The client's address (as uvicorn gives it, after trusted proxy headers) is this host's loopback."""
    address = client_ip(client)
    return address is not None and address.is_loopback


async def metrics_backends(request: Request) -> Response:
    gw: Gateway = request.app.state.gateway
    key = gw.config.server.metrics_key
    client = client_host(request.scope)
    if key:
        try:
            gw.auth.check_secret(header(request.scope, b"authorization"), client, key, METRICS_KEY)
        except ApiError as exc:
            return JSONResponse(exc.body(), exc.status, headers=exc.headers)
    addresses = bool(key) or on_loopback(client)
    return JSONResponse({"data": [describe(backend, addresses) for backend in gw.router.backends]})
