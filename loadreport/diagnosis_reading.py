"""What the diagnosis reads of one step: the typed report.json Step, with the step before and
after it, and the figures its rules compare (the engines' running, waiting, KV cache and cap,
the GPU, the users), each None where the run did not measure it.

A step from report.json arrives as a dict: `as_step` types it. A report written by an older
zerogap, or a step `zerogap tune --virtual` builds, lacks figures the diagnosis does not read;
those are filled as "not measured" (null, zero, or true for `valid`/`complete`), every figure
present is validated as report.json's schema says.
"""

from __future__ import annotations

import types
from collections.abc import Mapping
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel

from loadreport.schema import Latency, Step

FEW_SAMPLES = 3  # fewer scrapes of the engines in a window than this: the evidence says so
WAITING_MIN = 1.0  # requests queued at the engines, mean over the window, at least ...
WAITING_SHARE = 0.10  # ... and 10% of the users (a few arrivals between two steps are no queue)


def pct(ratio: float | None) -> str:
    return "n/a" if ratio is None else f"{ratio * 100:.0f}%"


def at_engines(step: Step) -> float | None:
    """The share of the users' requests that the engines hold (running + waiting); None in open loop."""
    running, users = step.backend.running_mean, step.users or step.concurrency
    if running is None or not users or step.concurrency is None:
        return None
    return (running + (step.backend.waiting_mean or 0.0)) / users


def p50(latency: Latency | None) -> float | None:
    """A latency's p50, None when the figure was not collected."""
    return None if latency is None else latency.p50


class Reading:
    """One step's figures, with the step before and after it (None at the ends)."""

    def __init__(self, step: Step, before: Step | None, after: Step | None) -> None:
        self.step, self.before, self.after = step, before, after
        backend = step.backend
        self.running = backend.running_mean
        self.running_max = backend.running_max
        self.waiting = backend.waiting_mean
        self.kv = backend.kv_cache_usage_max or backend.kv_cache_usage_mean
        self.preemptions = backend.preemptions or 0.0
        self.cap = backend.max_num_seqs
        self.num_samples = backend.num_samples
        self.gateway_inflight = backend.gateway_inflight_mean
        self.client_inflight = step.client_inflight_mean  # sent by the load generator, not yet wholly back
        self.gpu_pct = None if step.gpu_util is None else step.gpu_util.mean
        self.users = float(step.users) if step.users else step.concurrency

    def figures(self) -> str:
        """The server-side evidence, as far as it is known."""
        parts = []
        if self.running is not None:
            cap = f" of a cap of {self.cap:g}" if self.cap else ""
            parts.append(f"running {self.running:.1f}{cap}")
        if self.waiting is not None:
            parts.append(f"waiting {self.waiting:.1f}")
        if self.kv is not None:
            parts.append(f"KV cache {pct(self.kv)}")
        if self.preemptions:
            parts.append(f"{self.preemptions:g} preemptions")
        if self.gateway_inflight is not None:
            parts.append(f"gateway in flight {self.gateway_inflight:.1f}")
        if self.client_inflight is not None and self.running is not None:
            parts.append(f"load generator in flight {self.client_inflight:.1f}")
        if self.gpu_pct is not None:
            parts.append(f"GPU busy {self.gpu_pct:.0f}%")
        if self.step.token_interval_ms is not None:
            parts.append(f"token interval (GPU idle per step) {self.step.token_interval_ms:.1f} ms")
        if self.step.cpu_interval_ms is not None:
            parts.append(f"CPU per step {self.step.cpu_interval_ms:.1f} ms")
        if not parts:
            return "no server signals (set metrics.backend_metrics_urls)"
        if self.num_samples is not None and self.num_samples < FEW_SAMPLES:
            parts.append(f"engines read by {self.num_samples:g} scrape(s) only: lengthen the step's measured "
                         "window or lower metrics.sample_interval_ms")  # fmt: skip
        return ", ".join(parts)

    def queued(self) -> bool:
        if self.waiting is None:
            return False
        base = self.users or (self.waiting + (self.running or 0.0))
        return self.waiting >= max(WAITING_MIN, WAITING_SHARE * base)


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The model a field holds (itself or inside `X | None`), else None."""
    for candidate in (annotation, *get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def _absent(annotation: Any) -> Any:
    """A figure the step does not have: null where the schema allows it, else "nothing measured"."""
    nested = _model_in(annotation)
    if get_origin(annotation) in (Union, types.UnionType) and type(None) in get_args(annotation):
        return None
    if nested is not None:
        return _filled(nested, {})
    if get_origin(annotation) is Literal:
        return get_args(annotation)[0]
    if annotation is bool:
        return True  # valid, complete: nothing says otherwise
    kinds: dict[Any, Any] = {int: 0, float: 0.0, str: ""}
    return kinds.get(annotation, {})  # dict fields: empty


def _filled(model: type[BaseModel], data: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(data)
    for name, field in model.model_fields.items():
        nested = _model_in(field.annotation)
        if name in out:
            if nested is not None and isinstance(out[name], Mapping):
                out[name] = _filled(nested, out[name])
        elif field.is_required():
            out[name] = _absent(field.annotation)
    return out


def as_step(step: Step | Mapping[str, Any]) -> Step:
    """report.json's step (or a partial one, see the module's text) as the typed Step."""
    return step if isinstance(step, Step) else Step.model_validate(_filled(Step, step))
