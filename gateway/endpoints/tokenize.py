"""POST /tokenize and /detokenize (vLLM's own endpoints) through the gateway: a client that
holds a key counts tokens with the tokenizer of the model it will ask for, without knowing
the engines' addresses (the load-test harness calibrates its prompts this way).

The request goes through the completions' admission (gateway/tenants/admission.py): the key, the
Content-Type, the body's size, the key's rpm and max_concurrency (its slot held until the answer
is sent: a tenant cannot flood the engines through it), then the body's JSON and `model`
(gateway/endpoints/request.py's model_of) and the model's allow-list (one 404 for a model that is not
there and one the key may not use). Then it goes to a healthy backend of that model, under the
backend's own name for it and with the backend's api_key (never the client's). The engine's
answer is returned as it is.

It is counted as a completion is: zerogap_requests_total and zerogap_request_duration_seconds
(model, backend, key, status), and one request with 0 tokens in the key's usage (/admin/usage)
once a backend answered. And told as one: `x-request-id` and `x-zerogap-overhead-ms` on every
answer, the request id and the trace context sent to the backend, a request log line and spans
(gateway/observe/tokenize_story.py)."""

from __future__ import annotations

import json
import time

from gateway.endpoints.request import model_of
from gateway.gateway import Gateway
from gateway.observe.tokenize_story import TokenizeCall
from gateway.pool.model_pool import Backend, ModelPool
from gateway.server.asgi import ClientGone, Receive, Scope, Send, read_body, send_bytes
from gateway.server.errors import ApiError
from gateway.server.strict_json import decode_object
from gateway.tenants.admission import Admission, admit_head, admit_model, refuse
from gateway.upstream.client import UpstreamError

PATHS = ("/tokenize", "/detokenize")


def _backend(pool: ModelPool, model: str) -> Backend:
    backend = pool.choose()
    if backend is None:
        raise ApiError(503, f"No healthy backend serves model {model!r} right now.", "server_error",
                       code="no_backend", headers={"Retry-After": "1"})  # fmt: skip
    return backend


async def _forward(
    gw: Gateway, backend: Backend, path: str, body: dict[str, object], call: TokenizeCall
) -> tuple[int, bytes, bytes]:
    """The backend's answer: (status, body, content type)."""
    if backend.upstream_model:
        body = {**body, "model": backend.upstream_model}
    headers = {"Content-Type": "application/json"}
    if backend.api_key:
        headers["Authorization"] = f"Bearer {backend.api_key}"
    encoded = json.dumps(body).encode()
    call.upstream_headers(headers)
    try:
        resp = await gw.client.post(backend.url + path, encoded, headers)
        try:
            data = await resp.read_all()
        except BaseException:
            resp.close()
            raise
        resp.release()
        call.answered_s = time.monotonic()
    except UpstreamError as exc:
        raise ApiError(502, f"The backend for this model {exc.failure}. Retry.", "server_error",
                       code="upstream_error") from None  # fmt: skip
    if resp.status == 404:
        raise ApiError(501, f"This model's engine does not serve {path}.", "invalid_request_error",
                       code="not_supported")  # fmt: skip
    return resp.status, data, (resp.content_type or "application/json").encode()


class Tokenize:
    """POST `path` (one of PATHS, possibly under [server].base_url's path), sent on as `upstream_path`."""

    def __init__(self, upstream_path: str) -> None:
        self.upstream_path = upstream_path

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        arrived_s = time.monotonic()
        gw: Gateway = scope["app"].state.gateway
        admission = Admission(arrived_s)
        gw.observer.begin(scope, admission.marks)
        call = TokenizeCall(admission.marks, self.upstream_path)
        try:
            try:
                status, data, content_type = await self._answer(gw, scope, receive, admission, call)
            except ApiError as exc:
                if admission.backend != "none":  # a backend was asked: its time is counted too
                    self._observe(gw, admission, exc.status, arrived_s)
                call.status, call.error = exc.status, exc.code or str(exc.status)
                await refuse(gw, scope, send, exc, admission, call.waited_s())
                return
            except ClientGone:
                call.status, call.error = 499, "client_gone"
                return
            gw.metrics.requests.labels(admission.model, admission.backend, admission.key, str(status)).inc()
            self._observe(gw, admission, status, arrived_s)
            call.status, call.error = status, None if status == 200 else f"upstream_{status}"
            await send_bytes(send, status, data, call.answer_headers(), content_type)
        finally:
            admission.release(gw)
            call.key, call.model, call.backend = admission.key, admission.model, admission.backend
            gw.observer.tokenized(scope, call)

    async def _answer(
        self, gw: Gateway, scope: Scope, receive: Receive, admission: Admission, call: TokenizeCall
    ) -> tuple[int, bytes, bytes]:
        who = await admit_head(gw, scope, admission)
        raw = await read_body(receive, scope, gw.config.gateway.max_body_bytes)
        admission.body_read = True
        body = decode_object(raw)
        model = model_of(body)
        admission.marks.body_s = time.monotonic()
        backend = _backend(admit_model(gw, who, model, admission), model)
        admission.marks.done_s = time.monotonic()
        admission.backend = backend.name
        answer = await _forward(gw, backend, self.upstream_path, body, call)
        gw.usage.record(who.name, model, 0, 0)  # a request, no tokens
        return answer

    @staticmethod
    def _observe(gw: Gateway, admission: Admission, status: int, arrived_s: float) -> None:
        duration = gw.metrics.duration.labels(admission.model, admission.backend, str(status))
        duration.observe(time.monotonic() - arrived_s)


def tokenize_routes(prefix: str) -> dict[str, Tokenize]:
    """The endpoints by exact path, also under the path of [server].base_url."""
    paths = {path: Tokenize(path) for path in PATHS}
    if prefix:
        paths.update({prefix + path: endpoint for path, endpoint in list(paths.items())})
    return paths
