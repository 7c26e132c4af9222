"""`zerogap sim calibrate`: fit the [sim] cost model to stepped load-test runs.

The forward model is the sim itself in virtual time (pool_predict.predict: the same
scheduler, cost model and closed loop as `zerogap sim plan`), run at each measured step's
load; a Levenberg-Marquardt search (least_squares.py) scales the terms the data can pin
down (fit_terms.py) so that the modelled output TPS, TPOT p50, TTFT p50, GPU busy and CPU
interval match the measured ones in log terms. The cap (max_num_seqs) and the KV cache are
read off the engines' metrics where they show them, not searched.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace

import numpy as np

from backends.sim.calibrate.fit_terms import Term, TermChoice, base_values, choose_terms
from backends.sim.calibrate.least_squares import Vector, least_squares, standard_errors
from backends.sim.calibrate.runs import Observation, engine_ttft_ms, gauges_read
from backends.sim.plan.pool_predict import Predicted
from backends.sim.plan.stepped import Schedule, Step, measure_steps, simulate
from backends.sim.settings import SimSettings

TTFT_WEIGHT = 0.5  # TTFT p50 is the noisiest figure of a step (it rides on the step boundaries)
UNSTEADY_WEIGHT = 0.5
# A modelled figure that is missing (no request ended in the window). Above any log error the data can
# give, or the fit prefers a model that finishes nothing: beside two busy loops vLLM's bursts made the
# client's TPOT 0.01 ms against the model's 3.3 (a log error of 5.8), and with 2.0 here the fit took the
# engine to 128 ms per sequence, where every figure was missing, as the cheaper answer.
MISSING_PENALTY = 12.0
KV_MIN_USAGE = 0.05  # below this the KV usage says little about the capacity


@dataclass(frozen=True, slots=True)
class StepFit:
    observation: Observation
    model: Predicted


@dataclass
class Calibration:
    settings: SimSettings
    fitted: dict[str, float]  # [sim] field -> fitted value
    terms: list[Term]
    notes: list[str]
    steps: list[StepFit]
    num_evaluations: int
    elapsed_s: float
    log_errors: list[float] = field(default_factory=list)  # each term's standard error, in log terms (inf: unseen)


def _e2e_s(o: Observation) -> float:
    if o.e2e_p50_ms is not None:
        return o.e2e_p50_ms / 1000.0
    if o.tpot_p50_ms is not None:
        return ((o.ttft_p50_ms or 0.0) + o.tpot_p50_ms * o.output_tokens) / 1000.0
    return o.users * o.output_tokens / o.output_tps


def schedule_of(observations: list[Observation], replicas: int) -> tuple[Schedule, list[Observation]]:
    """One run's steps as a schedule for one replica (its share of the users), each step
    shortened to what a steady window needs: a few request lifetimes before it and enough
    requests in it (a 3-minute step costs no more than a 20-second one)."""
    steps = sorted(observations, key=lambda o: o.index)
    out = []
    for o in steps:
        e2e = _e2e_s(o)
        measure = min(o.measure_s or 1e9, max(2.0, 16.0 / o.users) * e2e, 60.0)
        pre = min(max(o.step_s - o.measure_s, 0.0), max(1.5 * e2e, 1.0))
        out.append(Step(max(1, round(o.users / replicas)), pre + max(measure, 0.5), max(measure, 0.5)))
    first = steps[0]
    warmup = min(first.warmup_s, max(1.5 * _e2e_s(first), 1.0))
    return Schedule(tuple(out), first.prompt_tokens, first.output_tokens, warmup_s=warmup), steps


def with_engine_signals(
    settings: SimSettings, observations: list[Observation], replicas: int
) -> tuple[SimSettings, list[str]]:
    """max_num_seqs and kv_cache_blocks from what the engines' metrics said, with notes."""
    notes: list[str] = []
    caps = sorted({o.max_num_seqs for o in observations if o.max_num_seqs})
    if caps:
        cap = max(1, caps[-1] // replicas)
        if cap != settings.max_num_seqs:
            notes.append(
                f"max_num_seqs {cap}: what the engines reported, used for the fit (CONFIG says "
                f"{settings.max_num_seqs}; set [scheduler] max_num_seqs = {cap} in FILE for its predictions)"
            )
            settings = settings.with_flags(max_num_seqs=cap)
    estimates = []
    block = settings.cost.block_size
    for o in observations:
        if o.kv_usage_mean and o.kv_usage_mean >= KV_MIN_USAGE and o.running_mean:
            blocks_per_seq = (o.prompt_tokens + o.output_tokens / 2) / block + 0.5
            estimates.append(o.running_mean / replicas * blocks_per_seq / o.kv_usage_mean)
    if estimates:
        blocks = max(1, round(float(np.median(estimates))))
        notes.append(
            f"kv_cache_blocks {blocks} (x block_size {block} = {blocks * block:,} tokens per engine): from the "
            f"engines' KV usage against their running requests ({len(estimates)} step(s) over {KV_MIN_USAGE:.0%} used)"
        )
        settings = settings.with_flags(kv_cache_blocks=blocks)
    else:
        notes.append(
            f"KV cache: never {KV_MIN_USAGE:.0%} used (or not reported): its capacity is not pinned down; "
            f"kv_cache_blocks kept at {settings.cost.kv_cache_blocks}"
        )
    return settings, notes


class _Objective:
    def __init__(
        self, settings: SimSettings, observations: list[Observation], replicas: int, choice: TermChoice
    ) -> None:
        self.settings = settings
        self.observations = observations
        self.replicas = replicas
        self.terms = choice.terms
        self.base = {**base_values(settings), **choice.fixed}
        runs: dict[tuple[str, int, int], list[Observation]] = {}
        for o in observations:  # a run with several prompt lengths is one schedule per length
            runs.setdefault((o.run, o.prompt_tokens, o.output_tokens), []).append(o)
        self.schedules = [schedule_of(group, replicas) for group in runs.values()]
        read = gauges_read(observations)  # the engine's part of each measured TTFT: data, fixed for the fit
        self.ttft_targets = [engine_ttft_ms(o, o.ttft_fitted_ms, read) for o in observations]
        self.num_evaluations = 0

    def settings_at(self, x: Vector) -> SimSettings:
        values = dict(self.base)
        for term, factor in zip(self.terms, np.exp(x), strict=True):
            for name in term.fields:
                values[name] = self.base[name] * float(factor)
        return self.settings.with_flags(**values)

    def predictions(self, x: Vector) -> list[Predicted]:
        """In the order of self.observations; TPS and the running count summed over the replicas."""
        settings = self.settings_at(x)
        self.num_evaluations += 1
        found: dict[int, Predicted] = {}
        for seed, (schedule, steps) in enumerate(self.schedules):
            for o, p in zip(steps, measure_steps(simulate(settings, schedule, seed), schedule), strict=True):
                found[id(o)] = replace(
                    p, output_tps=p.output_tps * self.replicas, running_mean=p.running_mean * self.replicas
                )
        return [found[id(o)] for o in self.observations]

    def __call__(self, x: Vector) -> Vector:
        out: list[float] = []
        for o, p, in_engine in zip(self.observations, self.predictions(x), self.ttft_targets, strict=True):
            w = 1.0 if o.steady else UNSTEADY_WEIGHT
            out.append(w * _log_ratio(p.output_tps, o.output_tps))
            if o.tpot_mean_ms is not None or o.tpot_p50_ms is not None:
                tpot = (p.tpot_mean_ms, o.tpot_mean_ms) if o.tpot_mean_ms else (p.tpot_p50_ms, o.tpot_p50_ms or 0.0)
                out.append(w * _log_ratio(*tpot))
            if in_engine is not None:  # the engine's part, modelled and measured; the mean where it is measured
                model = p.engine_ttft_mean_ms if o.ttft_mean_ms else p.engine_ttft_p50_ms
                out.append(w * TTFT_WEIGHT * _log_ratio(model, in_engine))
            if o.gpu_busy is not None:
                out.append(w * _log_ratio(max(p.gpu_busy, 0.01), max(o.gpu_busy, 0.01)))
            if o.cpu_interval_ms is not None:
                out.append(w * _log_ratio(p.cpu_interval_ms, max(o.cpu_interval_ms, 1e-3)))
        return np.asarray(out, dtype=float)


def _log_ratio(model: float | None, measured: float) -> float:
    if model is None or model <= 0 or measured <= 0:
        return MISSING_PENALTY
    return math.log(model / measured)


def _start(objective: _Objective, observations: list[Observation]) -> Vector:
    """Every time term scaled by how far the model's steps are from the measured ones."""
    x = np.zeros(len(objective.terms))
    ratios = []
    for o, p in zip(observations, objective.predictions(x), strict=True):
        if o.tpot_p50_ms is not None and p.tpot_p50_ms:
            ratios.append(o.tpot_p50_ms / p.tpot_p50_ms)
        elif p.output_tps > 0:
            ratios.append(p.output_tps / o.output_tps)
    if ratios:
        scale = math.log(float(np.median(ratios)))
        for i, term in enumerate(objective.terms):
            if term.fields != ("client_gap_ms",):
                x[i] = scale
    return x


def calibrate(settings: SimSettings, observations: list[Observation], replicas: int = 1) -> Calibration:
    started = time.monotonic()
    settings, notes = with_engine_signals(settings, observations, replicas)
    choice = choose_terms(settings, observations)
    objective = _Objective(settings, observations, replicas, choice)
    solution = least_squares(objective, _start(objective, observations))
    fitted_settings = objective.settings_at(solution.x)
    fitted = {
        name: float(getattr(fitted_settings.cost, name)) for term in choice.terms for name in term.fields
    } | choice.fixed
    errors = [float(e) for e in standard_errors(solution)]
    errors = [
        math.inf if float(np.abs(column).max(initial=0.0)) < 1e-3 else e
        for e, column in zip(errors, solution.jacobian.T, strict=True)
    ]
    steps = [StepFit(o, p) for o, p in zip(observations, objective.predictions(solution.x), strict=True)]
    return Calibration(
        settings=fitted_settings,
        fitted=fitted,
        terms=choice.terms,
        notes=notes + choice.notes,
        steps=steps,
        num_evaluations=objective.num_evaluations,
        elapsed_s=time.monotonic() - started,
        log_errors=errors,
    )
