"""create_app(config): the ASGI app: plain middleware, the completion endpoints, and Starlette for the rest."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from common.config import Config
from gateway.endpoints.admin import admin_routes
from gateway.endpoints.backends_info import PATH as METRICS_BACKENDS
from gateway.endpoints.backends_info import metrics_backends
from gateway.endpoints.completions import Completions
from gateway.endpoints.tokenize import tokenize_routes
from gateway.gateway import Gateway
from gateway.observe.log_throttle import LogThrottle
from gateway.server.asgi import ASGIApp, client_host, header
from gateway.server.errors import ApiError, error_body
from gateway.server.middleware import ErrorShield, FastPath
from gateway.upstream.client import UpstreamClient

log = logging.getLogger("zerogap.gateway")

METRICS_KEY = "[server].metrics_key"


def _gw(request: Request) -> Gateway:
    gw: Gateway = request.app.state.gateway
    return gw


def _error(exc: ApiError) -> JSONResponse:
    return JSONResponse(exc.body(), exc.status, headers=exc.headers)


async def health(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


def _client(request: Request) -> str | None:
    return client_host(request.scope)


async def ready(request: Request) -> Response:
    """The status for load balancers (no key needed); the per-backend detail only for
    [server].metrics_key when it is set (backend names, URLs' hosts and load are for operators)."""
    gw = _gw(request)
    router = gw.router
    if gw.drain.draining:
        status, code = "not ready: shutting down", 503
    elif router.ready():
        status, code = "ready", 200
    else:
        status, code = "not ready: no healthy backend", 503
    answer: dict[str, object] = {"status": status}
    key = gw.config.server.metrics_key
    authorization = header(request.scope, b"authorization")
    if not key or gw.auth.holds_secret(authorization, _client(request), key, METRICS_KEY):
        answer["backends"] = {
            b.name: {"model": b.model, "up": b.healthy, "inflight": b.num_inflight} for b in router.backends
        }
        answer["key_store"] = "up" if gw.auth.store_up else "down"
    return JSONResponse(answer, code)


async def metrics(request: Request) -> Response:
    """Prometheus text; with [server].metrics_key set, only for `Authorization: Bearer <metrics_key>`
    (the page names every tenant's key and its token counts). The admin and unified keys do not open it."""
    gw = _gw(request)
    key = gw.config.server.metrics_key
    if key:
        try:
            gw.auth.check_secret(header(request.scope, b"authorization"), _client(request), key, METRICS_KEY)
        except ApiError as exc:
            return _error(exc)
    return Response(gw.metrics.render(gw.router), media_type="text/plain; version=0.0.4; charset=utf-8")


async def models(request: Request) -> Response:
    gw = _gw(request)
    try:
        who = await gw.auth.authenticate(header(request.scope, b"authorization"), _client(request))
    except ApiError as exc:
        return _error(exc)
    data = [
        {"id": name, "object": "model", "created": 0, "owned_by": "zerogap"}
        for name in sorted(gw.router.pools)
        if who.may_use(name)
    ]
    return JSONResponse({"object": "list", "data": data})


HTTP_ERROR_CODES = {404: "not_found", 405: "method_not_allowed"}


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
    code = HTTP_ERROR_CODES.get(status, f"http_{status}")
    return JSONResponse(error_body(message, "invalid_request_error", None, code), status)


def api_prefix(base_url: str) -> str:
    """'/api' for base_url 'http://host:8000/api/' (and '' for a bare host)."""
    return urlsplit(base_url).path.rstrip("/")


def fast_routes(prefix: str) -> dict[str, ASGIApp]:
    """The completion endpoints and /tokenize, /detokenize, also under the path of [server].base_url."""
    chat, text = Completions(chat=True), Completions(chat=False)
    paths: dict[str, ASGIApp] = {"/v1/chat/completions": chat, "/v1/completions": text}
    if prefix:
        paths.update({prefix + path: endpoint for path, endpoint in list(paths.items())})
    return {**paths, **tokenize_routes(prefix)}


def routes(prefix: str) -> list[BaseRoute]:
    api: list[BaseRoute] = [Route("/v1/models", models, methods=["GET"])]
    if prefix:
        api.append(Route(prefix + "/v1/models", models, methods=["GET"]))
    return [
        *api,
        Route("/health", health, methods=["GET"]),
        Route("/ready", ready, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route(METRICS_BACKENDS, metrics_backends, methods=["GET"]),
    ]


def create_app(config: Config, client: UpstreamClient | None = None) -> ErrorShield:
    """The gateway app (its `.state.gateway` is the Gateway while it runs).
    `client` replaces the upstream HTTP client (tests)."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        gw = Gateway(config, client)
        app.state.gateway = gw
        throttle = LogThrottle()
        throttle.install()
        flushing = asyncio.create_task(throttle.flush_forever())
        try:
            await gw.start()
            if not config.server.metrics_key:
                log.info('[server].metrics_key is not set: GET /metrics is open and has no key names (key="all"), '
                         "GET /metrics/backends gives backend addresses only to this host's loopback")  # fmt: skip
            yield
        finally:
            try:
                await gw.stop()
            finally:
                flushing.cancel()
                throttle.flush()
                throttle.uninstall()

    prefix = api_prefix(config.server.base_url)
    admin = admin_routes() if config.server.admin_key else []  # absent: /admin/... answers 404
    app = Starlette(routes=[*routes(prefix), *admin], lifespan=lifespan, exception_handlers={HTTPException: http_error})
    return ErrorShield(FastPath(app, fast_routes(prefix)))
