"""A latency histogram at 0.1 ms resolution (Locust rounds values under 100 ms to
whole milliseconds; TPOT and ITL live at a few ms, so that is not enough).

Sparse: one counter per occupied 0.1 ms bucket, so memory follows the spread of the
values, not their range. Mergeable across processes; the mean is exact.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

_PER_MS = 10  # buckets per millisecond


class Histogram:
    __slots__ = ("buckets", "count", "max_ms", "min_ms", "sum_ms")

    def __init__(self) -> None:
        self.buckets: dict[int, int] = {}
        self.count = 0
        self.sum_ms = 0.0
        self.min_ms = math.inf
        self.max_ms = -math.inf

    def add_ms(self, value_ms: float, times: int = 1) -> None:
        key = int(value_ms * _PER_MS + 0.5)
        self.buckets[key] = self.buckets.get(key, 0) + times
        self.count += times
        self.sum_ms += value_ms * times
        self.min_ms = min(self.min_ms, value_ms)
        self.max_ms = max(self.max_ms, value_ms)

    def add_many_ms(self, values_ms: Iterable[float]) -> None:
        for value in values_ms:
            self.add_ms(value)

    def merge(self, other: Histogram) -> None:
        for key, num in other.buckets.items():
            self.buckets[key] = self.buckets.get(key, 0) + num
        self.count += other.count
        self.sum_ms += other.sum_ms
        self.min_ms = min(self.min_ms, other.min_ms)
        self.max_ms = max(self.max_ms, other.max_ms)

    def percentile(self, pct: float) -> float | None:
        """The smallest bucket value with at least pct% of the samples at or below it."""
        if self.count == 0:
            return None
        rank = max(1, math.ceil(self.count * pct / 100.0))
        seen = 0
        for key in sorted(self.buckets):
            seen += self.buckets[key]
            if seen >= rank:
                return key / _PER_MS
        return max(self.buckets) / _PER_MS  # pragma: no cover - rank <= count

    def mean(self) -> float | None:
        return self.sum_ms / self.count if self.count else None

    def summary(self) -> dict[str, float | None]:
        """{p50, p90, p99, mean} in ms, rounded to the 0.1 ms resolution (mean to 0.01)."""
        mean = self.mean()
        return {
            "p50": self.percentile(50),
            "p90": self.percentile(90),
            "p99": self.percentile(99),
            "mean": None if mean is None else round(mean, 2),
        }

    def to_wire(self) -> list[list[float]]:
        """[[key, count], ..., [sum_ms, min_ms, max_ms]]: plain lists for Locust's msgpack."""
        pairs: list[list[float]] = [[key, num] for key, num in self.buckets.items()]
        pairs.append([self.sum_ms, self.min_ms, self.max_ms])
        return pairs

    @classmethod
    def from_wire(cls, wire: list[list[float]]) -> Histogram:
        hist = cls()
        if not wire:
            return hist
        *pairs, (sum_ms, min_ms, max_ms) = wire
        for key, num in pairs:
            hist.buckets[int(key)] = hist.buckets.get(int(key), 0) + int(num)
            hist.count += int(num)
        hist.sum_ms, hist.min_ms, hist.max_ms = float(sum_ms), float(min_ms), float(max_ms)
        return hist


def summarize(values_ms: Iterable[float]) -> dict[str, float | None]:
    hist = Histogram()
    hist.add_many_ms(values_ms)
    return hist.summary()
