"""The OpenAI error body and the exception that carries it to the client."""

from __future__ import annotations

import json
from typing import Any, TypeVar

# the limit behind each 429 code (zerogap_ratelimited_total's label, the spans' zerogap.limit)
LIMIT_OF_CODE = {"rate_limit_requests": "rpm", "rate_limit_tokens": "tpm", "concurrency_limit": "concurrency"}


class ApiError(Exception):
    """An error the client caused or must know about; becomes {"error": {...}} with `status`."""

    def __init__(
        self,
        status: int,
        message: str,
        type_: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)

    def encoded(self) -> bytes:
        return json.dumps(self.body()).encode()


def unknown_model(model: str) -> ApiError:
    """The one answer for a model no pool serves and for a model the key may not use (the same
    status, code and message), so that a key cannot learn which other models the pool has."""
    return ApiError(
        404, f"The model {model!r} does not exist or this key may not use it. GET /v1/models lists the models "
        "this key may use.", param="model", code="model_not_found",
    )  # fmt: skip


def error_body(message: str, type_: str, param: str | None = None, code: str | int | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def sse_error(message: str, type_: str = "upstream_error", code: str | int | None = None) -> bytes:
    """The SSE event that ends a stream which failed after its first byte; then [DONE]."""
    event = json.dumps(error_body(message, type_, None, code)).encode()
    return b"data: " + event + b"\n\ndata: [DONE]\n\n"


def error_message(body: bytes) -> str | None:
    """The message of an OpenAI error body ({"error": {"message": ...}} or {"error": "..."}), else None."""
    try:
        error = json.loads(body)["error"]
    except (ValueError, KeyError, TypeError):
        return None
    message = error.get("message") if isinstance(error, dict) else error
    return message if isinstance(message, str) else None


E = TypeVar("E", bound=BaseException)


def bare(exc: E) -> E:
    """The exception without its traceback and context, for keeping past its except block: the
    traceback holds the frames that hold its keeper, a reference cycle that only the collector's
    rare full passes would free (thresholds in gateway/cli.py)."""
    exc.__traceback__ = None
    exc.__context__ = None
    exc.__cause__ = None
    return exc
