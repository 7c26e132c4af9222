"""The outlier rules on one interval's counts of a model's backends (Envoy's success-rate and
failure-percentage outlier detection, made to hold for pools of two or three backends).

Only backends with at least `outlier_min_requests` requests ended in the interval are judged,
and each against its peers (the others judged), so that a failure that hits every backend (a
client's bad prompts, a shared dependency) ejects none:

- **Success rate**: ejected when its success rate is below the peers' mean by more than
  `outlier_success_rate_stdev_factor` (4) times the spread. The spread is the larger of the
  peers' standard deviation (Envoy's; with two or three backends it is 0 or tiny) and the
  binomial noise of the difference: sqrt(q(1-q)(1/n + 1/n_peers)), q the failure share of all
  of them (at least one failure in n), so that the chance alone of a healthy backend's worse
  interval is about 3 in 100,000 per interval.
- **Failure percentage**: ejected when at least `outlier_failure_percentage_threshold` (50) % of
  its requests failed, unless its peers' failure share is that high too.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from common.config.gateway import GatewaySection


@dataclass(frozen=True)
class Tally:
    """One backend's interval: requests that ended there (pardoned 5xx left out) and failures."""

    name: str
    num_requests: int
    num_failures: int

    @property
    def failure_share(self) -> float:
        return self.num_failures / self.num_requests if self.num_requests else 0.0


def verdict(tallies: Sequence[Tally], settings: GatewaySection) -> list[tuple[str, str]]:
    """(backend name, the reason with its figures) of each outlier, the worst first."""
    judged = [t for t in tallies if t.num_requests >= settings.outlier_min_requests]
    outliers = []
    for t in sorted(judged, key=lambda t: t.failure_share, reverse=True):
        peers = [p for p in judged if p is not t]
        why = failure_percentage(t, peers, settings) or success_rate(t, peers, settings)
        if why is not None:
            outliers.append((t.name, f"{why} in the last {settings.outlier_interval_s:g} s"))
    return outliers


def success_rate(t: Tally, peers: Sequence[Tally], settings: GatewaySection) -> str | None:
    if not peers:
        return None  # nothing to compare with
    rates = [1 - p.failure_share for p in peers]
    mean = sum(rates) / len(rates)
    sd_peers = math.sqrt(sum((r - mean) ** 2 for r in rates) / len(rates))
    num_peer_requests = sum(p.num_requests for p in peers)
    q = (t.num_failures + sum(p.num_failures for p in peers)) / (t.num_requests + num_peer_requests)
    q = min(max(q, 1 / t.num_requests), 0.5)
    noise = math.sqrt(q * (1 - q) * (1 / t.num_requests + 1 / num_peer_requests))
    spread = max(sd_peers, noise)
    factor = settings.outlier_success_rate_stdev_factor
    threshold = mean - factor * spread
    rate = 1 - t.failure_share
    if rate >= threshold:
        return None
    return (
        f"success rate {rate:.1%} ({t.num_failures} of {t.num_requests} failed) below its peers' "
        f"{mean:.1%} - {factor:g} x {spread:.2%} (outlier_success_rate_stdev_factor x spread) = {threshold:.1%}"
    )


def failure_percentage(t: Tally, peers: Sequence[Tally], settings: GatewaySection) -> str | None:
    threshold = settings.outlier_failure_percentage_threshold
    percent = 100 * t.failure_share
    if percent < threshold:
        return None
    num_peer_requests = sum(p.num_requests for p in peers)
    peer_percent = 100 * sum(p.num_failures for p in peers) / num_peer_requests if peers else 0.0
    if peers and peer_percent >= threshold:
        return None  # all of them fail as much: not this backend's fault
    return (
        f"failure share {percent:.1f}% ({t.num_failures} of {t.num_requests}) at or above "
        f"outlier_failure_percentage_threshold {threshold:g}% (its peers': {peer_percent:.1f}%)"
    )
