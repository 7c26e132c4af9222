"""POST /tokenize and /detokenize (vLLM's own endpoints) through the gateway: a client that
holds a key counts tokens with the tokenizer of the model it will ask for, without knowing
the engines' addresses (the load-test harness calibrates its prompts this way).

The request is checked as a completion's is: the key, the Content-Type, the body's size, its
JSON and `model` (gateway/request.py's model_of), the model's allow-list, the key's rpm and
max_concurrency (a tenant cannot flood the engines through it). Then it goes to a healthy
backend of that model, under the backend's own name for it and with the backend's api_key
(never the client's). The engine's answer is returned as it is."""

from __future__ import annotations

import json

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gateway.asgi import client_host, header, read_body
from gateway.errors import ApiError, model_not_allowed, unknown_model
from gateway.gateway import Gateway
from gateway.limits import limited_at_head
from gateway.pool import Backend
from gateway.proxy import check_content_type
from gateway.request import model_of
from gateway.strict_json import decode_object
from gateway.upstream import UpstreamError

PATHS = ("/tokenize", "/detokenize")


def _backend(gw: Gateway, model: str) -> Backend:
    pool = gw.router.pools.get(model)
    if pool is None:
        raise unknown_model(model)
    backend = pool.choose()
    if backend is None:
        raise ApiError(503, f"No healthy backend serves model {model!r} right now.", "server_error",
                       code="no_backend", headers={"Retry-After": "1"})  # fmt: skip
    return backend


async def _forward(gw: Gateway, backend: Backend, path: str, body: dict[str, object]) -> Response:
    if backend.upstream_model:
        body = {**body, "model": backend.upstream_model}
    headers = {"Content-Type": "application/json"}
    if backend.api_key:
        headers["Authorization"] = f"Bearer {backend.api_key}"
    try:
        resp = await gw.client.post(backend.url + path, json.dumps(body).encode(), headers)
        try:
            data = await resp.read_all()
        except BaseException:
            resp.close()
            raise
        resp.release()
    except UpstreamError as exc:
        raise ApiError(502, f"The backend for this model {exc.failure}. Retry.", "server_error",
                       code="upstream_error") from None  # fmt: skip
    if resp.status == 404:
        raise ApiError(501, f"This model's engine does not serve {path}.", "invalid_request_error",
                       code="not_supported")  # fmt: skip
    return Response(data, resp.status, media_type=resp.content_type or "application/json")


async def tokenize(request: Request) -> Response:
    gw: Gateway = request.app.state.gateway
    scope, client = request.scope, client_host(request.scope)
    path = "/tokenize" if request.url.path.endswith("/tokenize") else "/detokenize"
    slot = None
    try:
        who = await gw.auth.authenticate(header(scope, b"authorization"), client)
        check_content_type(scope)
        if limited_at_head(who):
            slot = await gw.limiter.admit(who)
        body = decode_object(await read_body(request.receive, scope, gw.config.gateway.max_body_bytes))
        model = model_of(body)
        if not who.may_use(model):
            raise model_not_allowed(model)
        return await _forward(gw, _backend(gw, model), path, body)
    except ApiError as exc:
        return JSONResponse(exc.body(), exc.status, headers=exc.headers)
    finally:
        if slot is not None:
            gw.limiter.release(slot)
