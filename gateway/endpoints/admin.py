"""The admin API ([server].admin_key set; otherwise these paths answer 404):

    POST   /admin/keys          {"name", "models"?, "rpm"?, "tpm"?, "max_concurrency"?, "expires_in_days"?}
                                -> 201, the secret once
    GET    /admin/keys          {"data": [...]}, never secrets
    DELETE /admin/keys/{name}   200, revoked (every gateway on the store refuses it within a second)
    GET    /admin/usage         {"data": [{"key", "model", "requests", "prompt_tokens", "completion_tokens"}]}

Every call needs `Authorization: Bearer <admin key>` (compared in constant time, never logged).
A new key's fields are checked by gateway/tenants/keys/fields.py, as `zerogap keys create` checks them:
a bad one is a 422 naming it (`param`); a body that is not a JSON object a 400; one over
MAX_BODY_BYTES a 413, refused without reading past the limit.
"""

from __future__ import annotations

import json
import logging
import time
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from gateway.server.asgi import read_body
from gateway.server.errors import ApiError
from gateway.tenants.keys.base import DuplicateKeyName, KeyRecord, KeyStoreError
from gateway.tenants.keys.fields import InvalidKeyField, KeyFields, parse_key_fields

if TYPE_CHECKING:
    from gateway.gateway import Gateway

log = logging.getLogger("zerogap.gateway.admin")

MAX_BODY_BYTES = 128 * 1024  # room for the longest allow-list key_fields allows


def key_json(record: KeyRecord, now: float) -> dict[str, Any]:
    return {
        "name": record.name,
        "models": list(record.models) if record.models is not None else None,
        **record.limits.as_dict(),
        "created_at": int(record.created_at),
        "expires_at": int(record.expires_at) if record.expires_at is not None else None,
        "revoked": record.revoked_at is not None,
        "status": record.status(now),
    }


def _error(exc: ApiError) -> JSONResponse:
    return JSONResponse(exc.body(), exc.status, headers=exc.headers)


def _check_admin(request: Request, gw: Gateway) -> None:
    """The admin key, compared in constant time; failures count against the client's address as
    for API keys, and an address that fails too often gets 429 (gateway/tenants/auth_throttle.py)."""
    sent = request.headers.get("authorization")
    client = request.client.host if request.client else None
    authorization = sent.encode("latin-1") if sent is not None else None
    gw.auth.check_secret(authorization, client, gw.config.server.admin_key, "[server].admin_key")


def unavailable(exc: Exception) -> ApiError:
    log.warning("admin API: key store unavailable: %s", exc)
    return ApiError(
        503, "The key store is unavailable right now. Retry shortly.", "api_error", code="store_unavailable"
    )


def _too_large(max_bytes: int) -> ApiError:
    return ApiError(413, f"The body is larger than {max_bytes} bytes. Send only the key's fields.",
                    param=None, code="request_too_large")  # fmt: skip


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


async def _parse_new_key(request: Request) -> KeyFields:
    raw = await read_body(request.receive, request.scope, MAX_BODY_BYTES, _too_large)  # never read past it
    try:
        body = json.loads(raw, parse_constant=_no_constant)
    except (ValueError, RecursionError):  # RecursionError: nesting deeper than the parser's stack
        raise ApiError(400, "The body is not valid JSON. Send a JSON object such as {\"name\": \"team-a\"}.",
                       code="invalid_json") from None  # fmt: skip
    if not isinstance(body, dict):
        raise ApiError(400, 'The body must be a JSON object such as {"name": "team-a"}.', code="invalid_json")
    try:
        return parse_key_fields(body)
    except InvalidKeyField as exc:
        raise ApiError(422, f"{exc}", param=exc.param, code="invalid_value") from None


async def create_key(request: Request, gw: Gateway) -> Response:
    new = await _parse_new_key(request)
    expires_at = time.time() + new.expires_in_days * 86400 if new.expires_in_days else None
    try:
        secret = await gw.store.create(new.name, new.models, new.limits, expires_at)
    except DuplicateKeyName as exc:
        raise ApiError(409, str(exc), param="name", code="key_exists") from None
    except InvalidKeyField as exc:
        raise ApiError(422, str(exc), param=exc.param, code="invalid_value") from None
    except KeyStoreError as exc:  # the reserved name
        raise ApiError(400, str(exc), param="name", code="invalid_value") from None
    await gw.auth.reload()
    record = next(r for r in await gw.store.keys() if r.name == new.name)
    log.info("admin API: created key %r", new.name)
    return JSONResponse({**key_json(record, time.time()), "key": secret}, 201)


async def list_keys(request: Request, gw: Gateway) -> Response:
    now = time.time()
    return JSONResponse({"object": "list", "data": [key_json(r, now) for r in await gw.store.keys()]})


async def revoke_key(request: Request, gw: Gateway) -> Response:
    name = request.path_params["name"]
    if not any(r.name == name for r in await gw.store.keys()):
        raise ApiError(404, f"No key named {name!r}. GET /admin/keys lists the keys.", param="name",
                       code="key_not_found")  # fmt: skip
    await gw.store.revoke(name)
    await gw.auth.reload()
    log.info("admin API: revoked key %r", name)
    return JSONResponse({"name": name, "revoked": True})


async def usage(request: Request, gw: Gateway) -> Response:
    await gw.usage.flush()  # this process's latest counts too
    rows = [
        {"key": r.key_name, "model": r.model, "requests": r.num_requests, "prompt_tokens": r.prompt_tokens,
         "completion_tokens": r.completion_tokens}
        for r in await gw.store.usage()
    ]  # fmt: skip
    return JSONResponse({"object": "list", "data": rows})


def _endpoint(handler: Any) -> Any:
    async def endpoint(request: Request) -> Response:
        gw: Gateway = request.app.state.gateway
        try:
            _check_admin(request, gw)
            response: Response = await handler(request, gw)
            return response
        except ApiError as exc:
            return _error(exc)
        except KeyStoreError as exc:
            return _error(unavailable(exc))
        except Exception as exc:  # the database down or timing out: say so, never a 500 with a traceback
            return _error(unavailable(exc))

    return endpoint


def admin_routes() -> list[BaseRoute]:
    return [
        Route("/admin/keys", _endpoint(create_key), methods=["POST"]),
        Route("/admin/keys", _endpoint(list_keys), methods=["GET"]),
        Route("/admin/keys/{name}", _endpoint(revoke_key), methods=["DELETE"]),
        Route("/admin/usage", _endpoint(usage), methods=["GET"]),
    ]
