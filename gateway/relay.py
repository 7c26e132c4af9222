"""The proxy path: choose a backend, retry before the first byte, relay bytes as they
arrive, and account for the request when it ends.

`Relay.run` is one async generator: it yields a `Start` (status and headers, and the
whole body for a non-streamed answer) and then the bytes of the stream; the metrics,
usage and rate-limit settlement of the request happen in its `finally`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field

from gateway.auth import Principal
from gateway.errors import error_body, sse_error
from gateway.flights import Flight, Flights
from gateway.idle import IdleWatch
from gateway.limits import Limiter
from gateway.metrics import GatewayMetrics
from gateway.outlier import OutlierDetector
from gateway.pipe import Pipe
from gateway.pool import Backend, ModelPool
from gateway.request import Call
from gateway.routing.prefix import prompt_blocks
from gateway.sse import SseFilter, usage_tokens
from gateway.upstream import UpstreamClient, UpstreamError, UpstreamResponse
from gateway.usage import UsageRecorder
from zerogap.config.gateway import GatewaySection

log = logging.getLogger("zerogap.gateway.relay")

SSE_HEADERS = [
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
OUTLIER_LABELS = frozenset({"connect", "broken", "500", "502", "503", "504"})  # failures that count toward ejection


@dataclass
class Start:
    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes | None = None  # the whole answer, when it is not a stream


class Retry(Exception):
    """This attempt failed before the first byte; another backend may be tried."""

    def __init__(self, status: int, label: str, message: str, final: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.label = label
        self.message = message
        self.final = final  # no other backend is to be tried (the gateway is shutting down)


@dataclass
class Outcome:
    """What one request did; filled in as it goes, read in `finally`."""

    who: Principal
    call: Call
    estimate: int
    t0_s: float = field(default_factory=time.monotonic)
    status: int = 502
    backend: str = "none"
    started: bool = False  # status and headers went to the client
    first_s: float | None = None
    last_s: float | None = None
    usage: dict[str, int] | None = None
    replied: bool = False  # the relay has its answer (no more keep-alives while waiting for it)


def _json_start(status: int, body: bytes) -> Start:
    return Start(status, [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())], body)


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
    ) -> None:
        self.settings = settings
        self.client = client
        self.metrics = metrics
        self.limiter = limiter
        self.usage = usage
        self.flights = flights
        self.outlier = outlier

    async def run(self, out: Outcome, pool: ModelPool) -> AsyncGenerator[Start | bytes | Pipe, None]:
        tried: list[Backend] = []
        failure = Retry(503, "no_backend", f"No healthy backend serves model {out.call.model!r} right now.")
        hashes = self._prompt_blocks(out.call) if pool.affinity is not None else []
        try:
            while len(tried) <= self.settings.max_retries:
                backend = self._choose(out.call, pool, tried, hashes)
                if backend is None:
                    break
                if tried:
                    self.metrics.retries.labels(out.call.model, backend.name).inc()
                tried.append(backend)
                out.backend = backend.name
                backend.num_inflight += 1
                flight = self.flights.open(backend, pool.backends, tried, self.settings.max_retries + 1 - len(tried))
                try:
                    try:
                        resp, first = await self._open(out, backend, flight)
                        answer = self._answer(out, backend, resp, first)
                    except Retry as exc:
                        failure = exc
                        self._upstream_error(out, backend, exc)
                        if exc.final:
                            break
                        continue
                    if answer is not None:
                        yield answer
                    else:
                        async for item in self._stream(out, resp, first, flight):
                            yield item
                    return
                finally:
                    backend.num_inflight -= 1
                    self.flights.close(flight)
            yield self._fail(out, failure)
        except (asyncio.CancelledError, GeneratorExit):
            out.status = 499
            raise
        finally:
            self._account(out)

    def _prompt_blocks(self, call: Call) -> list[int]:
        s = self.settings.cache_aware
        return prompt_blocks(call.body, call.path.endswith("/chat/completions"), s.block_chars, s.max_prompt_blocks)

    def _choose(self, call: Call, pool: ModelPool, tried: list[Backend], hashes: list[int]) -> Backend | None:
        if pool.affinity is None:
            return pool.choose(tried)
        route = pool.route(tried, hashes)
        if route is None:
            return None
        self.metrics.route.observe(call.model, route)
        return route.backend

    def _upstream_error(self, out: Outcome, backend: Backend, exc: Retry) -> None:
        if exc.label == "draining":
            return
        self.metrics.upstream_errors.labels(out.call.model, backend.name, str(exc.label)).inc()
        log.warning("backend %s failed before the first byte (%s): %s", backend.name, exc.label, exc.message)
        if exc.label in OUTLIER_LABELS:
            self.outlier.failure(backend, exc.label)
        if exc.label == "connect":  # out until the next health check says otherwise
            self.flights.take_out(backend, f"connection refused ({exc.message})")

    def _fail(self, out: Outcome, failure: Retry) -> Start | bytes:
        out.status = failure.status
        out.replied = True
        if out.started:
            return sse_error(failure.message, code=failure.status)
        return _json_start(
            failure.status, json.dumps(error_body(failure.message, "upstream_error", None, failure.status)).encode()
        )

    async def _open(self, out: Outcome, backend: Backend, flight: Flight) -> tuple[UpstreamResponse, bytes]:
        """The backend's answer and its first bytes (the whole body when it is not a stream),
        within [gateway].first_byte_timeout_s, or until the backend leaves the pool (flight).
        Keep-alives meanwhile are the client side's business (proxy.serve), so this waits in
        line, without a task of its own."""
        headers = {"Content-Type": "application/json"}
        if backend.api_key:
            headers["Authorization"] = f"Bearer {backend.api_key}"
        timeout_s = self.settings.first_byte_timeout_s
        try:
            async with asyncio.timeout(timeout_s) as timeout:
                flight.waiting(timeout)
                try:
                    body = out.call.body_for(backend.upstream_model)
                    resp = await self.client.post(backend.url + out.call.path, body, headers)
                    try:
                        if resp.status != 200 or not out.call.stream:
                            return resp, await resp.read_all()
                        return resp, await resp.read_chunk()
                    except BaseException:
                        resp.close()
                        raise
                finally:
                    flight.timeout = None
        except TimeoutError:
            if flight.stop is not None:
                raise self._stopped(backend, flight) from None
            raise Retry(
                504,
                "first_byte_timeout",
                f"Backend {backend.name} sent nothing within {timeout_s} s ([gateway].first_byte_timeout_s).",
            ) from None
        except UpstreamError as exc:
            raise Retry(502, exc.reason, f"Backend {backend.name} failed: {exc.detail}") from None

    @staticmethod
    def _stopped(backend: Backend, flight: Flight) -> Retry:
        if flight.stop == "draining":
            message = "The gateway is shutting down ([gateway].drain_timeout_s passed); send the request again."
            return Retry(503, "draining", message, final=True)
        return Retry(502, "ejected", f"Backend {backend.name} left the pool before it answered.")

    def _answer(self, out: Outcome, backend: Backend, resp: UpstreamResponse, first: bytes) -> Start | bytes | None:
        """What to send for an answer that is not a stream to relay (None: relay the stream)."""
        status = resp.status
        if status == 200 and out.call.stream:
            if not first:
                resp.close()
                raise Retry(502, "empty", f"Backend {backend.name} closed the stream before sending anything.")
            self.outlier.success(backend)
            return None
        if status in RETRY_STATUSES:
            resp.close()
            raise Retry(502, str(status), f"Backend {backend.name} answered {status}: {first[:300]!r}")
        self.outlier.success(backend)
        resp.release()
        out.replied = True
        if status != 200:
            return self._refused(out, status, first)
        return self._whole(out, first)

    def _refused(self, out: Outcome, status: int, body: bytes) -> Start | bytes:
        """A 4xx from the backend: passed on as it is (inside the stream if one was started)."""
        out.status = status
        if not out.started:
            return _json_start(status, body)
        try:
            message = json.loads(body)["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = body[:300].decode(errors="replace")
        return sse_error(str(message), "invalid_request_error", status)

    def _whole(self, out: Outcome, body: bytes) -> Start:
        out.status = 200
        out.first_s = out.last_s = time.monotonic()
        try:
            usage = json.loads(body).get("usage")
            out.usage = usage if isinstance(usage, dict) else None
        except (ValueError, AttributeError):
            out.usage = None
        return _json_start(200, body)

    async def _stream(
        self, out: Outcome, resp: UpstreamResponse, first: bytes, flight: Flight
    ) -> AsyncIterator[Start | bytes | Pipe]:
        out.first_s = time.monotonic()
        out.status = 200
        out.replied = True
        clean = False
        filt = SseFilter(strip_usage=not out.call.client_wants_usage)
        idle_s = self.settings.idle_timeout_s
        watch = IdleWatch(idle_s, resp.close)
        flight.streaming(watch)
        try:
            if not out.started:
                out.started = True
                yield Start(200, SSE_HEADERS)
            data = filt.feed(first)
            if data:
                yield data
            pipe = Pipe(resp, filt, out, watch)
            yield pipe  # proxy._drive runs it: the rest of the body goes to the client from here
            if pipe.error is not None:  # the backend broke the stream (UpstreamError), or sending failed
                raise pipe.error
            if watch.fired:
                raise UpstreamError("idle", "idle timeout")
            rest = filt.rest()
            if rest:
                yield rest
            clean = True
        except UpstreamError as exc:
            if watch.fired:
                out.status, message = flight.ended(idle_s)
            else:
                out.status = 502
                message = f"The backend broke the stream: {exc.detail}"
                self.outlier.failure(flight.backend, "broken")
            yield sse_error(message, code=out.status)
        finally:
            watch.cancel()
            out.usage = filt.usage
            resp.release() if clean else resp.close()

    def _account(self, out: Outcome) -> None:
        call, m = out.call, self.metrics
        status = str(out.status)
        m.requests.labels(call.model, out.backend, out.who.name, status).inc()
        now = time.monotonic()
        m.duration.labels(call.model, out.backend, status).observe(now - out.t0_s)
        prompt, completion = usage_tokens(out.usage)
        if call.stream and out.first_s is not None:
            m.ttft.labels(call.model, out.backend).observe(out.first_s - out.t0_s)
            if completion > 1 and out.last_s is not None:
                m.tpot.labels(call.model, out.backend).observe((out.last_s - out.first_s) / (completion - 1))
        if prompt or completion:
            m.tokens.labels(call.model, out.who.name, "prompt").inc(prompt)
            m.tokens.labels(call.model, out.who.name, "completion").inc(completion)
            self.usage.record(out.who.name, call.model, prompt, completion)
        if out.who.tpm is not None:
            self.limiter.settle(out.who, out.estimate, prompt + completion)
        if log.isEnabledFor(logging.DEBUG):
            ttft_ms = f"{1000 * (out.first_s - out.t0_s):.1f}" if out.first_s is not None else "-"
            log.debug(
                "%s model=%s key=%s backend=%s status=%s ttft_ms=%s duration_ms=%.1f tokens=%d+%d",
                call.path, call.model, out.who.name, out.backend, status, ttft_ms, 1000 * (now - out.t0_s),
                prompt, completion,
            )  # fmt: skip
