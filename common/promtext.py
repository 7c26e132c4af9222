"""Read samples from a Prometheus text page (/metrics): one tolerant parser for the
gateway's load scrapes, the load test's server signals and the tests.

A line that does not parse (garbage, a truncated page) is skipped, never raised:
a scrape must not fail because one exporter wrote one odd line.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass

_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True, slots=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


def iter_samples(text: str | bytes) -> Iterator[Sample]:
    """Every sample line of the page, in order; comments and bad lines left out."""
    page = text.decode("utf-8", "replace") if isinstance(text, bytes) else text
    for line in page.splitlines():
        sample = _parse_line(line.strip())
        if sample is not None:
            yield sample


def _parse_line(line: str) -> Sample | None:
    if not line or line.startswith("#"):
        return None
    brace = line.find("{")
    space = line.find(" ")
    if brace != -1 and (space == -1 or brace < space):
        end = line.rfind("}")
        if end < brace:
            return None
        name, labels, rest = line[:brace], dict(_LABEL.findall(line[brace + 1 : end])), line[end + 1 :]
    elif space != -1:
        name, labels, rest = line[:space], {}, line[space:]
    else:
        return None
    fields = rest.split()
    if not fields:
        return None
    try:
        return Sample(name, labels, float(fields[0]))  # a timestamp may follow: ignored
    except ValueError:
        return None


def sum_samples(text: str | bytes, name: str, labels: Mapping[str, str] | None = None) -> float | None:
    """Sum of the samples of `name` whose labels include `labels`; None when there is none."""
    found = [
        s.value
        for s in iter_samples(text)
        if s.name == name and all(s.labels.get(k) == v for k, v in (labels or {}).items())
    ]
    return sum(found) if found else None


def sums_by_name(text: str | bytes, names: Collection[str]) -> dict[str, float]:
    """For each of `names` present on the page, the sum of its samples over every label set."""
    totals: dict[str, float] = {}
    for sample in iter_samples(text):
        if sample.name in names:
            totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    return totals
