"""One closed-loop load on a pool of simulated replicas, in virtual time, measured the way
the harness measures a step: output TPS over the window, TTFT and TPOT p50 of the requests
that ended in it, GPU busy as the replicas' mean busy share.

The users are split evenly over the replicas (a least-load gateway keeps them so); each
distinct share is one virtual engine run. Used by `zerogap sim calibrate` (the forward
model of the fit) and by the capacity answer of `zerogap sim plan --users N --slo ...`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from backends.sim.plan.virtual import VirtualRun, closed_loop
from backends.sim.settings import SimSettings


@dataclass(frozen=True, slots=True)
class Load:
    users: int
    prompt_tokens: int
    output_tokens: int


@dataclass(frozen=True, slots=True)
class Window:
    warm_s: float  # virtual seconds before the window (users start over the first second)
    measure_s: float


@dataclass(frozen=True, slots=True)
class Predicted:
    output_tps: float
    ttft_p50_ms: float | None  # None: no request ended in the window
    tpot_p50_ms: float | None
    gpu_busy: float  # 0-1, mean over the replicas
    cpu_interval_ms: float
    running_mean: float  # summed over the replicas
    num_requests: int
    ttft_mean_ms: float | None = None
    tpot_mean_ms: float | None = None
    engine_ttft_p50_ms: float | None = None  # from reaching the engine: the API server's time left out
    engine_ttft_mean_ms: float | None = None


def shares(users: int, replicas: int) -> list[int]:
    """users split as evenly as possible over replicas (a replica may get none)."""
    base, extra = divmod(users, replicas)
    return [base + (1 if i < extra else 0) for i in range(replicas)]


@dataclass
class _Tally:
    tokens: float = 0.0
    busy_s: float = 0.0
    cpu_s: float = 0.0
    num_steps: int = 0
    seq_steps_s: float = 0.0  # sum of batch size x step duration: the running count's time integral


def predict(settings: SimSettings, load: Load, replicas: int, window: Window, seed: int = 0) -> Predicted:
    counts: dict[int, int] = {}
    for share in shares(load.users, replicas):
        counts[share] = counts.get(share, 0) + 1
    tally = _Tally()
    ttfts: list[float] = []
    tpots: list[float] = []
    start, end = window.warm_s, window.warm_s + window.measure_s
    for share, num_replicas in counts.items():
        if share == 0:
            continue
        run = closed_loop(
            settings, share, load.prompt_tokens, load.output_tokens, end, ramp_s=min(1.0, window.warm_s), seed=seed
        )
        _add(tally, run, start, end, num_replicas)
        for r in run.requests:
            if r.finish_s is not None and start < r.finish_s <= end and r.ttft_s is not None:
                ttfts += [r.ttft_s] * num_replicas
                if r.tpot_s is not None:
                    tpots += [r.tpot_s] * num_replicas
    span = max(window.measure_s, 1e-9)
    return Predicted(
        output_tps=tally.tokens / span,
        ttft_p50_ms=1000.0 * float(np.percentile(ttfts, 50)) if ttfts else None,
        tpot_p50_ms=1000.0 * float(np.percentile(tpots, 50)) if tpots else None,
        gpu_busy=tally.busy_s / (span * replicas),
        cpu_interval_ms=1000.0 * tally.cpu_s / max(tally.num_steps, 1),
        running_mean=tally.seq_steps_s / span,
        num_requests=len(ttfts),
    )


def _add(tally: _Tally, run: VirtualRun, start: float, end: float, times: int) -> None:
    tally.tokens += run.num_tokens_between(start, end) * times  # as the clients got them
    for s in run.steps:
        if start < s.end_s <= end:
            tally.busy_s += s.forward_s * times
            tally.cpu_s += s.cpu_s * times
            tally.num_steps += times
            tally.seq_steps_s += s.num_seqs * s.duration_s * times
