"""How long a tune takes, from what it does, printed before it starts.

Real time, per candidate: the pool's start (to /health 200), Locust's start (and the
prompt's calibration), the warm-up and every step held for its duration (the measure
window is the end of the step: no extra time), Locust's report (report.json, two PNG
plots, report.html) and the pool's stop; then, once, tune's own report.

Virtual time (--virtual): no waiting, only CPU. Each step is simulated for step_s of
virtual time; the sim's cost model (the candidate's own [scheduler], [token_interval],
[sim]) gives how many engine steps that is at the step's batch, and the CPU the
simulation spends goes with the sequences it advances and the prompt tokens it builds.

The constants are from the 2-core development machine, idle; a busy machine stretches
the real run's overheads and the whole virtual run."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from backends.sim.engine.cost_model import CostModel
from backends.sim.settings import SimSettings, settings_from_config
from common.config.model import Config
from zerogap.tune.trial import Trial

STARTUP_S = {"sim": 2.0, "vllm": 90.0}  # the pool's start to /health 200 (its replicas start together)
STOP_S = {"sim": 0.5, "vllm": 10.0}  # SIGTERM to exit
HARNESS_START_S = 2.0  # Locust's start and the prompt's calibration (/tokenize)
HARNESS_REPORT_S = 2.5  # report.json, timeline.png, vs_load.png, report.html
TUNE_REPORT_S = 1.5  # once: tune.json, report.html, tune.png
VIRTUAL_SEQ_STEP_CPU_S = 3.5e-6  # virtual time: one sequence advanced by one engine step
VIRTUAL_PROMPT_TOKEN_CPU_S = 0.6e-6  # virtual time: one prompt token built and hashed (prefix cache)


@dataclass(frozen=True)
class CandidateEstimate:
    start_s: float  # the pool's start
    harness_s: float  # Locust's start and its report
    load_s: float  # the warm-up and the steps (real time), or the simulation's CPU (virtual time)
    stop_s: float  # the pool's stop

    @property
    def total_s(self) -> float:
        return self.start_s + self.harness_s + self.load_s + self.stop_s


@dataclass(frozen=True)
class Estimate:
    candidates: tuple[CandidateEstimate, ...]
    report_s: float  # tune's own report, once

    @property
    def total_s(self) -> float:
        return sum(c.total_s for c in self.candidates) + self.report_s

    def describe(self, virtual: bool) -> str:
        """'about 42 s in all (...)': the total and where it goes."""
        if virtual:
            return f"about {self.total_s:.0f} s in all (the simulations' CPU, then the report)"
        n = len(self.candidates)
        parts = {
            "start": sum(c.start_s for c in self.candidates) / n,
            "load": sum(c.load_s for c in self.candidates) / n,
            "Locust": sum(c.harness_s for c in self.candidates) / n,
            "stop": sum(c.stop_s for c in self.candidates) / n,
        }
        shown = ", ".join(f"{name} {value:.0f} s" for name, value in parts.items())
        return f"about {self.total_s:.0f} s in all ({shown} per candidate, then the report)"


def estimate(trial: Trial, configs: Sequence[Config]) -> Estimate:
    """The estimate for these candidates' configs (each one's own settings matter in virtual time)."""
    per = tuple(_virtual(trial, config) if trial.virtual else _real(trial) for config in configs)
    return Estimate(per, TUNE_REPORT_S)


def _real(trial: Trial) -> CandidateEstimate:
    load_s = trial.warmup_s + trial.step_s * len(trial.steps)
    return CandidateEstimate(STARTUP_S[trial.engine], HARNESS_START_S + HARNESS_REPORT_S, load_s, STOP_S[trial.engine])


def _virtual(trial: Trial, config: Config) -> CandidateEstimate:
    settings = settings_from_config(config)
    cpu_s = sum(virtual_step_cpu_s(settings, concurrency, trial) for concurrency in trial.steps)
    return CandidateEstimate(0.0, 0.0, cpu_s, 0.0)


def virtual_step_cpu_s(settings: SimSettings, concurrency: int, trial: Trial) -> float:
    """One step in virtual time: the engine steps the cost model takes in step_s at the steady
    batch (the users the slots and the KV cache hold), the sequences they advance, the prompts."""
    cost = settings.cost
    kv_seqs = cost.kv_cache_blocks * cost.block_size // max(1, trial.input_tokens + trial.output_tokens)
    batch = max(1, min(concurrency, settings.max_num_seqs, kv_seqs))
    prefill_tokens = min(batch * trial.input_tokens / trial.output_tokens, settings.max_num_batched_tokens)
    model = CostModel(settings)
    forward_s = model.forward_s(batch, round(prefill_tokens))
    interval_s = model.interval_s(batch, round(batch / trial.output_tokens))
    # as CostModel.step: async scheduling hides the interval behind the forward
    step_s = (
        max(forward_s, interval_s) + model.async_overhead_s if settings.async_scheduling else forward_s + interval_s
    )
    seq_steps = trial.step_s / step_s * batch
    num_requests = seq_steps / trial.output_tokens
    return seq_steps * VIRTUAL_SEQ_STEP_CPU_S + num_requests * trial.input_tokens * VIRTUAL_PROMPT_TOKEN_CPU_S
