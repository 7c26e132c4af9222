"""The proxy path: choose a backend, retry before the first byte, relay bytes as they
arrive, and account for the request when it ends.

`Relay.run` is one coroutine, from the admitted request to its answer's end: it sends through the
client's `Responder` (the head, a stream's body through its Pipe, the bytes it adds itself), and the
request's metrics, usage and rate-limit settlement happen in its `finally`. The Exchange is this
module's to write (the Pipe marks the stream's start through it).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

from common.config.gateway import GatewaySection
from gateway.endpoints.request import Call
from gateway.observe.metrics import GatewayMetrics
from gateway.observe.request_story import Observer
from gateway.pool.flights import Flight, Flights
from gateway.pool.model_pool import Backend, ModelPool
from gateway.pool.outlier import OutlierDetector, RequestFailures
from gateway.pool.routing.policy import Route
from gateway.pool.routing.prefix import Prompt
from gateway.relay import charging
from gateway.relay.assemble import Assembler
from gateway.relay.attempts import (
    CREDENTIAL_STATUSES,
    OUTLIER_LABELS,
    RETRY_STATUSES,
    AttemptFailed,
    finish_reasons,
    no_first_byte,
    stopped,
)
from gateway.relay.charging import choice_usage
from gateway.relay.continuation import Transcript, chat_call, continuable
from gateway.relay.exchange import Exchange, Reply, json_reply
from gateway.relay.idle import IdleWatch
from gateway.relay.pipe import Pipe
from gateway.relay.responder import Responder
from gateway.relay.resume import DONE_EVENT, BodyFor, Resume
from gateway.relay.sse import SHOW_ALL, SseFilter, shown_usage
from gateway.server.errors import bare, error_body, error_message, sse_error
from gateway.tenants.limits import Limiter
from gateway.tenants.usage import UsageRecorder
from gateway.upstream.client import UpstreamClient, UpstreamError, UpstreamResponse

log = logging.getLogger("zerogap.gateway.relay")


class Relay:
    def __init__(
        self,
        settings: GatewaySection,
        client: UpstreamClient,
        metrics: GatewayMetrics,
        limiter: Limiter,
        usage: UsageRecorder,
        flights: Flights,
        outlier: OutlierDetector,
        observer: Observer | None = None,
    ) -> None:
        self.settings = settings
        self.client = client
        self.metrics = metrics
        self.limiter = limiter
        self.usage = usage
        self.flights = flights
        self.outlier = outlier
        self.observer = observer

    async def run(self, exchange: Exchange, pool: ModelPool, out: Responder) -> None:
        """Relay the request to one of the pool's backends (retrying, continuing a broken stream) and
        its answer to the client through `out`; charge it when it is over, however it ends."""
        tried: list[Backend] = []
        no_backend = f"No healthy backend serves model {exchange.call.model!r} right now."
        failure = AttemptFailed(503, "no_backend", no_backend)
        prompt = self._prompt(exchange.call) if pool.policy.reads_prompt else None
        panicked = False
        failures = self.outlier.for_request()
        call = exchange.call
        filt = SseFilter(shown_usage(call.client_wants_usage, call.client_wants_continuous_usage), choice_usage(call))
        resume = Resume(call, self.settings.continue_streams and exchange.continue_ok and continuable(call))
        if resume.allowed:
            filt.transcript = Transcript(chat_call(call))
        exchange.routing = pool.policy.name
        try:
            while len(tried) <= self.settings.max_retries:
                route_s = time.monotonic()
                route = self._choose(exchange.call, pool, tried, prompt)
                if route is None:
                    break
                backend = route.backend
                attempt = exchange.attempt(backend.name, route_s, route.reason, resume.broken is not None)
                if tried:
                    self.metrics.retries.labels(exchange.call.model, backend.name).inc()
                if not backend.healthy:  # panic routing: none of the model's backends is healthy
                    self.metrics.panic_attempts.labels(exchange.call.model, backend.name).inc()
                    panicked = True
                tried.append(backend)
                exchange.backend = backend.name
                backend.num_inflight += 1
                flight = self.flights.open(backend, pool.backends, tried, self.settings.max_retries + 1 - len(tried))
                first_byte_deadline_s = time.monotonic() + self.settings.first_byte_timeout_s
                try:
                    try:
                        resp, first = await self._open(exchange, backend, flight, resume.body)
                        answer = self._answer(exchange, backend, resp, first)
                        failures.served()
                        if answer is not None:
                            await out.reply(answer)
                            return
                        await self._stream(exchange, resp, flight, first_byte_deadline_s, filt, resume, out)
                        if resume.broken is None:
                            return
                        if not resume.prepare(filt):
                            break
                        continue
                    except AttemptFailed as exc:  # before the first byte (the head, or a stream that ended first)
                        failure = bare(exc)
                        attempt.outcome = exc.label
                        self._upstream_error(exchange, backend, exc, failures)
                        if not exc.retryable:
                            break
                        continue
                except asyncio.CancelledError:
                    attempt.outcome = "client_gone"
                    raise
                finally:
                    attempt.end_s = time.monotonic()
                    attempt.outcome = attempt.outcome or resume.broken or exchange.error or "ok"
                    backend.num_inflight -= 1
                    self.flights.close(flight)
            if resume.failure is not None and resume.broken is not None:  # no backend could continue the stream
                resume.gave_up(self.metrics)
                exchange.status, event = resume.failure
                await out.body(event)
                return
            failures.unserved(len(tried))
            if panicked and failure.label != "draining":
                failure = AttemptFailed(503, "no_backend", f"{no_backend} Tried anyway: {failure.message}")
            await out.reply(self._fail(exchange, failure))
        except asyncio.CancelledError:
            exchange.status = 499
            exchange.error = "client_gone"
            raise
        finally:
            prompt_tokens, completion_tokens = charging.settle(exchange, self.metrics, self.limiter, self.usage)
            if self.observer is not None and self.observer.active:
                if filt.choices is not None:  # several choices: each one's, by index
                    exchange.finish_reasons = exchange.finish_reasons or filt.choices.finish_reasons() or None
                elif filt.transcript is not None and filt.transcript.reason:
                    exchange.finish_reasons = [filt.transcript.reason]
                self.observer.ended(exchange, prompt_tokens, completion_tokens)

    def _prompt(self, call: Call) -> Prompt:
        s = self.settings.cache_aware
        return Prompt.of(call.body, call.path.endswith("/chat/completions"), s.block_chars, s.max_prompt_blocks)

    def _choose(
        self, call: Call, pool: ModelPool, tried: list[Backend], prompt: Prompt | None
    ) -> Route[Backend] | None:
        route = pool.route(tried, prompt)
        if route is not None and pool.policy.by_prefix:
            self.metrics.route.observe(call.model, route)
        return route

    def _upstream_error(
        self, exchange: Exchange, backend: Backend, exc: AttemptFailed, failures: RequestFailures
    ) -> None:
        if exc.label == "draining":
            return
        self.metrics.upstream_errors.labels(exchange.call.model, backend.name, str(exc.label)).inc()
        log.warning(
            "backend %s failed before the first byte (%s): %s", backend.name, exc.label, exc.detail or exc.message
        )
        if exc.label in OUTLIER_LABELS:
            failures.failed(backend, exc.label)
        if exc.label == "connect":  # out of the pool until the next health check says otherwise
            self.flights.take_out(backend, f"connection failed ({exc.detail or exc.message})", "connect")

    def _fail(self, exchange: Exchange, failure: AttemptFailed) -> Reply | bytes:
        exchange.status = failure.status
        exchange.error = failure.label
        exchange.replied = True
        if exchange.started:
            return sse_error(failure.message, code=failure.status)
        body = json.dumps(error_body(failure.message, "upstream_error", None, failure.status)).encode()
        return json_reply(failure.status, body, exchange.answer_headers())

    async def _open(
        self, exchange: Exchange, backend: Backend, flight: Flight, body_for: BodyFor | None = None
    ) -> tuple[UpstreamResponse, bytes]:
        """The backend's answer, and its whole body when it is not a stream (a stream's first byte is
        its pipe's to wait for), within [gateway].first_byte_timeout_s, or until the backend leaves
        the pool (flight).
        Keep-alives meanwhile are the client side's business (proxy.serve), so this waits in
        line, without a task of its own."""
        headers = {"Content-Type": "application/json"}
        if backend.api_key:
            headers["Authorization"] = f"Bearer {backend.api_key}"
        exchange.upstream_headers(headers)  # x-request-id, traceparent; the attempt is sent from now
        timeout_s = self.settings.first_byte_timeout_s
        try:
            async with asyncio.timeout(timeout_s) as timeout:
                flight.waiting(timeout)
                try:
                    body = (body_for or exchange.call.body_for)(backend.upstream_model)
                    resp = await self.client.post(backend.url + exchange.call.path, body, headers)
                    exchange.attempts[-1].status, exchange.attempts[-1].head_s = resp.status, time.monotonic()
                    if resp.status == 200:  # a good start for the outlier rule, as a 5xx is a bad one:
                        self.outlier.success(backend)  # both are known when the headers come
                    try:
                        if resp.status == 200 and not exchange.call.stream and _is_stream(resp):
                            return resp, await self._assemble(exchange, resp)
                        if resp.status != 200 or not exchange.call.stream:
                            return resp, await resp.read_all()
                        return resp, b""  # a stream: its pipe waits for the first byte (_stream)
                    except BaseException:
                        resp.close()
                        raise
                finally:
                    flight.timeout = None
        except TimeoutError:
            if flight.stop is not None:
                raise stopped(backend, flight) from None
            raise AttemptFailed(
                504,
                "first_byte_timeout",
                f"Backend {backend.name} sent nothing within {timeout_s} s ([gateway].first_byte_timeout_s).",
            ) from None
        except UpstreamError as exc:
            raise AttemptFailed(502, exc.reason, f"Backend {backend.name} {exc.failure}.", detail=exc.detail) from None

    @staticmethod
    async def _assemble(exchange: Exchange, resp: UpstreamResponse) -> bytes:
        """A non-streamed answer from the stream the gateway asked for (assemble.py). A client that
        leaves meanwhile is charged what the engine made so far (cancelled here: the relay closes
        the backend's request, so the engine stops)."""
        call = exchange.call
        filt = SseFilter(SHOW_ALL, charging.choice_usage(call))
        assembler = Assembler(call.path.endswith("/chat/completions"), call.body.get("return_token_ids") is True)
        try:
            while chunk := await resp.read_chunk():
                assembler.feed(filt.feed(chunk))
            assembler.feed(filt.rest())
        except asyncio.CancelledError:
            if assembler.num_events:
                exchange.charge = charging.of_stream(call, filt)
            raise
        exchange.charge = charging.of_stream(call, filt)
        return assembler.body()

    def _answer(
        self, exchange: Exchange, backend: Backend, resp: UpstreamResponse, first: bytes
    ) -> Reply | bytes | None:
        """What to send for an answer that is not a stream to relay (None: relay the stream)."""
        status = resp.status
        if status == 200 and exchange.call.stream:
            return None
        if status in RETRY_STATUSES:
            resp.close()
            detail = f"answered {status}: {first[:300]!r}"  # the body may hold internal detail: the log's only
            raise AttemptFailed(502, str(status), f"Backend {backend.name} answered {status}.", detail=detail)
        if status in CREDENTIAL_STATUSES:
            resp.close()
            detail = f"answered {status} (check its api_key): {first[:300]!r}"
            message = f"Backend {backend.name} refused the gateway's credentials."
            raise AttemptFailed(502, str(status), message, detail=detail)
        self.outlier.success(backend)
        resp.release()
        exchange.replied = True
        if status != 200:
            return self._refused(exchange, backend, status, first)
        return self._whole(exchange, first)

    def _refused(self, exchange: Exchange, backend: Backend, status: int, body: bytes) -> Reply | bytes:
        """A 4xx is the client's to fix: the backend's OpenAI error body goes on as it is (inside the
        stream if one was started); vLLM's messages name the client's own input, never an address.
        Any other answer (another 5xx, a body that is no OpenAI error, such as a proxy's HTML page)
        is replaced by the gateway's own message, and logged."""
        message = error_message(body) if 400 <= status < 500 else None
        if message is None:
            log.warning("backend %s answered %s: %r", backend.name, status, body[:300])
            message = f"Backend {backend.name} answered {status} (its body is in the gateway's log)."
            status = status if 400 <= status < 500 else 502
            body = json.dumps(error_body(message, "upstream_error", None, status)).encode()
        exchange.status = status
        exchange.error = f"upstream_{status}"
        if not exchange.started:
            return json_reply(status, body, exchange.answer_headers())
        return sse_error(message, "invalid_request_error" if status < 500 else "upstream_error", status)

    def _whole(self, exchange: Exchange, body: bytes) -> Reply:
        exchange.status = 200
        exchange.first_s = exchange.last_s = time.monotonic()
        if exchange.charge is None:  # a whole body from the backend (not one put together here)
            try:
                answer = json.loads(body)
            except ValueError:
                answer = None
            exchange.charge = charging.of_body(exchange.call, answer)
        if self.observer is not None and self.observer.active:  # the request log's and the spans'
            exchange.finish_reasons = finish_reasons(body) or None
        return json_reply(200, body, exchange.answer_headers())

    async def _stream(
        self, exchange: Exchange, resp: UpstreamResponse, flight: Flight, deadline_s: float, filt: SseFilter,
        resume: Resume, out: Responder,
    ) -> None:  # fmt: skip
        """The stream, relayed by a Pipe from its first byte on (it returns what broke it, if
        anything). Ended before its first byte, nothing reached the client: an
        AttemptFailed, and the relay tries another backend. Broken after it: the error event, or,
        when it can be continued (continuation.py), `resume.broken` set for the relay to go on."""
        clean = False
        call = exchange.call
        idle_s = self.settings.idle_timeout_s
        watch = IdleWatch(idle_s, resp.close, armed=False)  # armed by the pipe at the first byte
        pipe = Pipe(resp, filt, exchange, watch, flight, deadline_s)
        try:
            error = await out.pipe(pipe)
            if not pipe.relayed:
                raise no_first_byte(flight, pipe, error, self.settings.first_byte_timeout_s)
            resume.relayed(self.metrics)
            exchange.error = None  # a stream continued: no error so far
            if error is None and watch.fired:
                error = UpstreamError("idle", "idle timeout")
            if error is None and filt.errored:
                error = UpstreamError("error_event", "an error event inside the stream", "sent an error event")
            if error is None and resume.unfinished(filt):
                error = UpstreamError("broken", "the stream ended without [DONE]", "ended the stream before its end")
            if isinstance(error, UpstreamError):  # the backend broke the stream, or went quiet
                event = self._stream_broken(exchange, flight, error, watch.fired)
                verdict = resume.broke(flight, watch.fired, filt, event, exchange.status, self.metrics)
                if verdict == "done":  # every token came: the stream ends as it would have
                    exchange.status = 200
                    await out.body(filt.rest() + DONE_EVENT)
                elif verdict == "error":
                    await out.body(event)
                return
            if error is not None:  # sending to the client failed
                try:
                    raise error
                finally:
                    del error  # the traceback holds this frame: no reference cycle through it
            self.outlier.success(flight.backend)  # it ended well: as a break counts when it comes, so does this
            rest = filt.rest()
            if rest:
                await out.body(rest)
            clean = True
        finally:
            watch.cancel()
            if pipe.relayed:
                exchange.charge = charging.of_stream(call, filt)  # what was relayed, however it ended
            resume.ended(filt, self.metrics)
            resp.release() if clean else resp.close()

    def _stream_broken(self, exchange: Exchange, flight: Flight, error: UpstreamError, idle: bool) -> bytes:
        exchange.error = flight.stop or ("idle" if idle else "broken")
        if idle:
            exchange.status, message = flight.ended(self.settings.idle_timeout_s)
        else:
            exchange.status = 502
            name = flight.backend.name
            message = f"Backend {name} broke the stream (it {error.failure})."
            log.warning("backend %s broke the stream: %s", name, error.detail)
            self.outlier.failure(flight.backend, "broken")
        return sse_error(message, code=exchange.status)


def _is_stream(resp: UpstreamResponse) -> bool:
    return resp.content_type.startswith("text/event-stream")
