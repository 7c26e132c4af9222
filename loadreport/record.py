"""What each request leaves behind, and the per-process store that ships it to the
master (Locust's report_to_master) or keeps it (local runs and the master).

Output tokens are spread over the arrival times of the request's content chunks
(usage.completion_tokens / content chunks each), so TPS over any window counts the
tokens streamed in that window, not the requests that happened to end in it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from loadreport.histogram import Histogram

INTERRUPTED = "interrupted"  # the test stopped while the request streamed: not a failure

BUCKETS_PER_S = 10  # token-arrival buckets of 100 ms


@dataclass(slots=True)
class RequestRecord:
    start: float  # wall clock (time.time) at send
    end: float
    ok: bool
    error_kind: str  # "" when ok; "HTTP 503", "timeout", "broken stream", ...
    ttft_s: float | None
    e2e_s: float
    output_tokens: int
    prompt_tokens: int
    token_source: str  # "usage" or "chunks"
    send_lag_s: float | None  # open loop: actual send - planned send
    itl: Histogram = field(default_factory=Histogram)
    streamed: bool = True  # False: a non-streamed answer (TTFT = E2E; no TPOT, no ITL)
    retries: int = 0  # attempts before this one (api.max_retries); start/TTFT/E2E count from the first
    ttfa_s: float | None = None  # send -> first answer token (after a reasoning model's reasoning)
    reasoning_tokens: int | None = None  # usage.completion_tokens_details.reasoning_tokens, or counted
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens, when reported
    line: int = 0  # the dataset's or trace's file line this request came from (0: a made-up prompt)
    trace_id: str = ""  # api.traceparent: the W3C trace id it sent (32 hex digits); "" when not traced

    @property
    def tpot_s(self) -> float | None:
        if self.ttft_s is None or self.output_tokens < 2 or not self.streamed:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)

    def to_wire(self) -> list[Any]:
        return [
            self.start,
            self.end,
            int(self.ok),
            self.error_kind,
            self.ttft_s,
            self.e2e_s,
            self.output_tokens,
            self.prompt_tokens,
            self.token_source,
            self.send_lag_s,
            self.itl.to_wire(),
            int(self.streamed),
            self.retries,
            self.ttfa_s,
            self.reasoning_tokens,
            self.cached_tokens,
            self.line,
            self.trace_id,
        ]

    @classmethod
    def from_wire(cls, wire: list[Any]) -> RequestRecord:
        start, end, ok, kind, ttft, e2e, out, prompt, source, lag, itl, streamed, retries = wire[:13]
        ttfa, reasoning, cached, line, trace_id = (*wire[13:18], None, None, None, 0, "")[:5]  # an older harness's
        return cls(
            start, end, bool(ok), kind, ttft, e2e, int(out), int(prompt), source, lag, Histogram.from_wire(itl),
            bool(streamed), int(retries), ttfa, reasoning, cached, int(line or 0), str(trace_id or ""),
        )  # fmt: skip


@dataclass
class TokensPerChunk:
    """This server's tokens per content chunk, learnt from requests that got their usage.
    A request cut off before its usage (test stopped, broken stream) counts its chunks at
    that rate, and its prompt at the mean prompt seen, so neither the output nor the total
    TPS of a window that ends mid-stream is undercounted."""

    usage_tokens: int = 0
    usage_chunks: int = 0
    usage_prompt_tokens: int = 0
    num_usage_requests: int = 0

    def apply(self, record: RequestRecord, content_walls: list[float]) -> None:
        if record.ok and record.token_source == "usage" and content_walls:
            self.usage_tokens += record.output_tokens
            self.usage_chunks += len(content_walls)
            self.usage_prompt_tokens += record.prompt_tokens
            self.num_usage_requests += 1
        elif not record.ok and content_walls and self.usage_chunks:
            record.output_tokens = round(len(content_walls) * self.usage_tokens / self.usage_chunks)
            record.token_source = "estimated"
            if not record.prompt_tokens:  # its prompt was processed (tokens came): count it at the mean
                record.prompt_tokens = round(self.usage_prompt_tokens / self.num_usage_requests)


def _add(buckets: dict[int, float], key: int, amount: float) -> None:
    buckets[key] = buckets.get(key, 0.0) + amount


MAX_ERROR_KINDS = 16
MAX_DETAIL_CHARS = 500


@dataclass
class Recorder:
    """One process's records, token-arrival buckets, CPU and event-loop lag samples."""

    records: list[RequestRecord] = field(default_factory=list)
    output_buckets: dict[int, float] = field(default_factory=dict)
    prompt_buckets: dict[int, float] = field(default_factory=dict)
    cpu_samples: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    # each process's event-loop lags, a histogram per second of the wall clock (one entry a second, as
    # the CPU samples: a long run's probes, 40 a second, are not kept one by one)
    loop_lag: dict[str, dict[int, Histogram]] = field(default_factory=dict)
    error_details: dict[str, str] = field(default_factory=dict)  # error kind -> the server's first message

    def note_error(self, kind: str, detail: str) -> None:
        """The first message of each kind of failure (a few kinds at most), for fail-fast on the master."""
        if detail and kind not in self.error_details and len(self.error_details) < MAX_ERROR_KINDS:
            self.error_details[kind] = detail[:MAX_DETAIL_CHARS]

    def add(self, record: RequestRecord, content_walls: list[float]) -> None:
        """content_walls: the wall-clock arrival time of each content chunk."""
        self.records.append(record)
        if content_walls:
            per_chunk = record.output_tokens / len(content_walls)
            for wall in content_walls:
                _add(self.output_buckets, int(wall * BUCKETS_PER_S), per_chunk)
        elif record.output_tokens:
            _add(self.output_buckets, int(record.end * BUCKETS_PER_S), float(record.output_tokens))
        if record.prompt_tokens:
            at = content_walls[0] if content_walls else record.end
            _add(self.prompt_buckets, int(at * BUCKETS_PER_S), float(record.prompt_tokens))

    def add_cpu(self, process: str, wall: float, cpu_percent: float) -> None:
        self.cpu_samples.setdefault(process, []).append((wall, cpu_percent))

    def busiest_cpu_between(self, start: float, end: float) -> float | None:
        """The busiest load-generator process's mean CPU percent in [start, end); None: no sample."""
        means = []
        for samples in self.cpu_samples.values():
            inside = [cpu for wall, cpu in samples if start <= wall < end]
            if inside:
                means.append(sum(inside) / len(inside))
        return max(means) if means else None

    def add_loop_lag(self, process: str, wall: float, lag_ms: float) -> None:
        seconds = self.loop_lag.setdefault(process, {})
        second = int(wall)
        if second not in seconds:
            seconds[second] = Histogram()
        seconds[second].add_ms(lag_ms)

    def worst_loop_lag_between(self, start: float, end: float) -> Histogram | None:
        """The event-loop lag in the seconds of [start, end) of the load-generator process that lagged
        most (by p90)."""
        worst: Histogram | None = None
        for seconds in self.loop_lag.values():
            lags = Histogram()
            for second, hist in seconds.items():
                if start <= second < end:
                    lags.merge(hist)
            if lags.count and (worst is None or (lags.percentile(90) or 0.0) > (worst.percentile(90) or 0.0)):
                worst = lags
        return worst

    def drain(self) -> dict[str, Any]:
        """Everything recorded since the last drain, as plain lists for msgpack; then forget it."""
        wire = {
            "records": [record.to_wire() for record in self.records],
            "output": [[key, value] for key, value in self.output_buckets.items()],
            "prompt": [[key, value] for key, value in self.prompt_buckets.items()],
            "cpu": {name: [list(sample) for sample in samples] for name, samples in self.cpu_samples.items()},
            "loop_lag": {
                name: [[second, hist.to_wire()] for second, hist in seconds.items()]
                for name, seconds in self.loop_lag.items()
            },
            "details": self.error_details,
        }
        self.records, self.output_buckets, self.prompt_buckets, self.cpu_samples = [], {}, {}, {}
        self.loop_lag = {}
        self.error_details = {}
        return wire

    def ingest(self, wire: dict[str, Any]) -> list[RequestRecord]:
        """Add what another process drained; returns its records (for the live exporter)."""
        records = [RequestRecord.from_wire(item) for item in wire.get("records", [])]
        self.records.extend(records)
        for key, value in wire.get("output", []):
            _add(self.output_buckets, int(key), float(value))
        for key, value in wire.get("prompt", []):
            _add(self.prompt_buckets, int(key), float(value))
        for name, samples in wire.get("cpu", {}).items():
            self.cpu_samples.setdefault(name, []).extend((float(t), float(c)) for t, c in samples)
        for name, seconds in (wire.get("loop_lag") or {}).items():
            mine = self.loop_lag.setdefault(name, {})
            for second, hist in seconds:
                mine.setdefault(int(second), Histogram()).merge(Histogram.from_wire(hist))
        for kind, detail in (wire.get("details") or {}).items():
            self.note_error(str(kind), str(detail))
        return records

    def tokens_between(self, start: float, end: float, prompt: bool = False) -> float:
        """Tokens that arrived in [start, end); a 100 ms bucket cut by an edge counts pro rata."""
        buckets = self.prompt_buckets if prompt else self.output_buckets
        low, high = start * BUCKETS_PER_S, end * BUCKETS_PER_S
        total = 0.0
        for key, value in buckets.items():
            if low - 1 < key < high:
                total += value * max(0.0, min(key + 1, high) - max(key, low))
        return total
