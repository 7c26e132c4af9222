"""The HTTP API on aiohttp.web: vLLM's OpenAI-compatible routes plus /metrics.

Each request gets a Sequence in the engine and a TokenSink (one of each per choice when it
asks for several: choices.py); a streaming handler writes whatever tokens piled up since it
last ran, in one write. A client that disconnects cancels its handler (handler_cancellation)
or fails its write; either way the request is aborted (every choice) and its slots and KV
blocks are freed.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from aiohttp import web

from backends.sim.engine import words
from backends.sim.server.choices import Choices
from backends.sim.server.protocol import GenerationRequest, RequestError, parse_generation
from backends.sim.server.reasoning import response_builder
from backends.sim.server.sse import ResponseBuilder
from backends.sim.server.step_loop import RealtimeEngine
from backends.sim.server.stream import SseWriter, TokenSink, Transport
from backends.sim.server.tokenize_api import LearnedWords, detokenize, tokenize
from backends.sim.settings import SimSettings

ENGINE = web.AppKey("engine", RealtimeEngine)
SETTINGS = web.AppKey("settings", SimSettings)
LEARNED = web.AppKey("learned_words", LearnedWords)
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
_log = logging.getLogger("zerogap.sim")


def create_app(settings: SimSettings) -> web.Application:
    app = web.Application(middlewares=[_errors])
    app[SETTINGS] = settings
    app[LEARNED] = LearnedWords()
    app.cleanup_ctx.append(_engine_lifespan)
    app.router.add_post("/v1/chat/completions", _chat)
    app.router.add_post("/v1/completions", _completions)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/health", _health)
    app.router.add_post("/tokenize", _tokenize)
    app.router.add_post("/detokenize", _detokenize)
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/sim/stats", _stats)
    app.router.add_post("/sim/stats/reset", _stats_reset)
    return app


async def _engine_lifespan(app: web.Application) -> Any:
    engine = RealtimeEngine(app[SETTINGS])
    app[ENGINE] = engine
    engine.start()
    yield
    await engine.stop()


@web.middleware
async def _errors(request: web.Request, handler: Any) -> web.StreamResponse:
    try:
        response: web.StreamResponse = await handler(request)
        return response
    except ConnectionResetError as exc:  # the client left (a cut stream, a closed socket): normal, no traceback
        _log.debug("client gone: %s %s (%s)", request.method, request.path, exc)
        return web.Response(status=499, reason="Client Closed Request")  # its socket is closing: never sent
    except RequestError as exc:
        return web.json_response(exc.body(), status=exc.status)
    except web.HTTPRequestEntityTooLarge as exc:
        error = RequestError(f"The request body is too large ({exc.text}).", status=413)
        return web.json_response(error.body(), status=413)
    except (web.HTTPNotFound, web.HTTPMethodNotAllowed) as exc:
        routes = (
            "POST /v1/chat/completions, POST /v1/completions, GET /v1/models, POST /tokenize, POST /detokenize, "
            "GET /metrics"
        )
        message = f"{exc.reason}: {request.method} {request.path}. This server has {routes}, GET /health."
        body = {"error": {"message": message, "type": type(exc).__name__[4:] + "Error", "param": None,
                          "code": exc.status}}  # fmt: skip
        return web.json_response(body, status=exc.status)


async def _json_body(request: web.Request) -> Any:
    """The body as JSON; RequestError with the gateway's words (gateway/server/strict_json.py) when it is not."""
    raw = await request.read()
    try:
        text = raw.decode()
    except UnicodeDecodeError as exc:
        raise RequestError(f"The body is not valid UTF-8 (byte {exc.start}). Send JSON encoded as UTF-8.") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise RequestError(f"The body is not valid JSON ({exc}). Send a JSON object.") from None


async def _chat(request: web.Request) -> web.StreamResponse:
    return await _generate(request, chat=True)


async def _completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, chat=False)


async def _generate(request: web.Request, chat: bool) -> web.StreamResponse:
    settings = request.app[SETTINGS]
    gen = parse_generation(await _json_body(request), settings, chat)
    engine = request.app[ENGINE]
    if not gen.single:
        return await _generate_choices(request, gen, engine, settings.model)
    seq = engine.core.new_sequence(gen.prompt_token_ids, gen.max_tokens, time.monotonic(), gen.ignore_eos, gen.stop_ids)
    sink = engine.submit(seq)
    builder = response_builder(gen, settings)
    try:
        if gen.stream:
            return await _stream(request, builder, sink)
        reason = await sink.done
        return web.json_response(builder.full(sink.tokens, reason, seq.num_cached_tokens))
    finally:
        if not seq.finished:
            engine.abort(seq)


async def _stream(request: web.Request, builder: ResponseBuilder, sink: TokenSink) -> web.StreamResponse:
    response, transport, chunked = await _open_stream(request)
    if not sink.attach(SseWriter(transport, builder, chunked)):
        raise ConnectionResetError("the client went away")
    await sink.done
    await response.write_eof()
    return response


async def _generate_choices(
    request: web.Request, gen: GenerationRequest, engine: RealtimeEngine, model: str
) -> web.StreamResponse:
    """n > 1 or a list of prompts: a sequence per choice, prompt-major (choices.py)."""
    now = time.monotonic()
    seqs = [
        engine.core.new_sequence(prompt, max_tokens, now, gen.ignore_eos, gen.stop_ids)
        for prompt, max_tokens in gen.prompts
        for _ in range(gen.n)
    ]
    choices = Choices(gen, model, [engine.submit(seq) for seq in seqs])
    try:
        if not gen.stream:
            await choices.done
            return web.json_response(choices.body())
        response, transport, chunked = await _open_stream(request)
        if not choices.attach(transport, chunked):
            raise ConnectionResetError("the client went away")
        await choices.done
        await response.write_eof()
        return response
    finally:
        for seq in seqs:
            if not seq.finished:
                engine.abort(seq)


async def _open_stream(request: web.Request) -> tuple[web.StreamResponse, Transport, bool]:
    """The SSE response with its headers sent, the socket to write events to, and whether to chunk them."""
    response = web.StreamResponse(headers=SSE_HEADERS)
    chunked = request.version >= (1, 1)
    if chunked:
        response.enable_chunked_encoding()
    await response.prepare(request)
    transport = request.transport
    if transport is None:
        raise ConnectionResetError("the client went away")
    return response, transport, chunked


async def _models(request: web.Request) -> web.Response:
    settings = request.app[SETTINGS]
    card = {
        "id": settings.model,
        "object": "model",
        "created": 0,
        "owned_by": "zerogap-sim",
        "root": settings.model,
        "parent": None,
        "max_model_len": settings.max_model_len,
        "max_num_seqs": settings.max_num_seqs,  # the scheduler's caps: the load test's diagnosis reads them
        "max_num_batched_tokens": settings.max_num_batched_tokens,
    }
    return web.json_response({"object": "list", "data": [card]})


async def _health(request: web.Request) -> web.Response:
    return web.Response(status=200)


async def _tokenize(request: web.Request) -> web.Response:
    settings = request.app[SETTINGS]
    tokenized = tokenize(await _json_body(request), settings, request.app[LEARNED])
    return web.json_response(tokenized.body(settings.max_model_len))


async def _detokenize(request: web.Request) -> web.Response:
    text = detokenize(await _json_body(request), request.app[SETTINGS], request.app[LEARNED])
    return web.json_response({"prompt": text})


async def _metrics(request: web.Request) -> web.Response:
    body = request.app[ENGINE].metrics.render()
    return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})


async def _stats(request: web.Request) -> web.Response:
    engine = request.app[ENGINE]
    now = time.monotonic()
    body = {
        "mode": engine.settings.mode,
        "time_scale": engine.settings.time_scale,
        "step_lag_ms": engine.lag.summary_ms(),
        "step_work_ms": engine.work.summary_ms(),
        "gc_pause_ms": engine.gc.summary_ms(),
        "num_running": engine.core.num_running,
        "num_waiting": engine.core.num_waiting,
        "num_streams": len(engine.sinks),
        "gpu_busy_ratio": engine.window.busy_ratio(now),
        "token_interval_s": engine.window.mean_gap_s(now),
        "cpu_interval_s": engine.window.mean_cpu_s(now),
        "vocab_words": len(words.WORDS),
    }
    return web.json_response(body)


async def _stats_reset(request: web.Request) -> web.Response:
    request.app[ENGINE].lag.reset()
    request.app[ENGINE].gc.reset()
    request.app[ENGINE].work.reset()
    return web.json_response({"reset": True})
