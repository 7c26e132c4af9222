"""create_app(config): the Starlette app with the gateway's routes, middleware and lifespan."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from gateway.asgi import header
from gateway.errors import ApiError, error_body
from gateway.middleware import ErrorShield
from gateway.proxy import Completions
from gateway.state import Gateway
from gateway.upstream import UpstreamClient
from zerogap.config import Config

log = logging.getLogger("zerogap.gateway")


def _gw(request: Request) -> Gateway:
    gw: Gateway = request.app.state.gateway
    return gw


def _error(exc: ApiError) -> JSONResponse:
    return JSONResponse(exc.body(), exc.status, headers=exc.headers)


async def health(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


async def ready(request: Request) -> Response:
    router = _gw(request).router
    backends = {b.name: {"model": b.model, "up": b.healthy, "inflight": b.num_inflight} for b in router.backends}
    if router.ready():
        return JSONResponse({"status": "ready", "backends": backends})
    return JSONResponse({"status": "not ready: no healthy backend", "backends": backends}, 503)


async def metrics(request: Request) -> Response:
    gw = _gw(request)
    return Response(gw.metrics.render(gw.router), media_type="text/plain; version=0.0.4; charset=utf-8")


async def models(request: Request) -> Response:
    gw = _gw(request)
    try:
        who = gw.auth.authenticate(header(request.scope, b"authorization"))
    except ApiError as exc:
        return _error(exc)
    data = [
        {"id": name, "object": "model", "created": 0, "owned_by": "zerogap"}
        for name in sorted(gw.router.pools)
        if who.may_use(name)
    ]
    return JSONResponse({"object": "list", "data": data})


async def http_error(request: Request, exc: Exception) -> Response:
    status = exc.status_code if isinstance(exc, HTTPException) else 500
    if status == 404:
        message = (
            f"No such endpoint: {request.method} {request.url.path}. See GET /v1/models, POST /v1/chat/completions."
        )
    elif status == 405:
        message = f"Method {request.method} is not allowed on {request.url.path}."
    else:
        message = str(getattr(exc, "detail", "")) or "Request failed."
    return JSONResponse(error_body(message, "invalid_request_error", None, status), status)


def api_prefix(base_url: str) -> str:
    """'/api' for base_url 'http://host:8000/api/' (and '' for a bare host)."""
    return urlsplit(base_url).path.rstrip("/")


def routes(prefix: str) -> list[BaseRoute]:
    api: list[BaseRoute] = [
        Route("/v1/chat/completions", Completions(chat=True)),
        Route("/v1/completions", Completions(chat=False)),
        Route("/v1/models", models, methods=["GET"]),
    ]
    if prefix:
        api += [Route(prefix + r.path, r.endpoint, methods=r.methods) for r in api if isinstance(r, Route)]
    return [
        *api,
        Route("/health", health, methods=["GET"]),
        Route("/ready", ready, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]


def create_app(config: Config, client: UpstreamClient | None = None) -> Starlette:
    """The gateway app. `client` replaces the aiohttp upstream client (tests)."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        gw = Gateway(config, client)
        app.state.gateway = gw
        await gw.start()
        try:
            yield
        finally:
            await gw.stop()

    app = Starlette(
        routes=routes(api_prefix(config.server.base_url)),
        lifespan=lifespan,
        exception_handlers={HTTPException: http_error},
    )
    app.add_middleware(ErrorShield)
    return app
