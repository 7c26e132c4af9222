"""backends/sim/calibrate/fit.py `with_engine_signals`: the KV cache's size read off the engines' KV
usage against their running requests. A sequence holds its prompt and the output made so far, so
over its life it holds, on average, its prompt and half its output. The engine here is the sim's
own core (its block manager counts the blocks), run with no clock: the gauges are its per-step
means, as the harness averages the engine's /metrics over a window."""

from __future__ import annotations

import random

import pytest

from backends.sim.calibrate.fit import with_engine_signals
from backends.sim.calibrate.runs import Observation
from backends.sim.engine.core import EngineCore
from backends.sim.plan.virtual import random_prompt
from backends.sim.settings import SimSettings

BLOCKS = 6000  # the engine's true KV cache, in blocks of 16 tokens
USERS = 32


def engine_gauges(settings: SimSettings, prompt_tokens: int, output_tokens: int) -> tuple[float, float]:
    """(running, KV usage) averaged over the engine's steps once it is steady: USERS users in a closed
    loop, each sending its next request when the last one ends, their first requests spread over one
    request's life (as a run's users drift apart)."""
    core, rng = EngineCore(settings), random.Random(0)

    def send() -> None:
        core.add(core.new_sequence(random_prompt(rng, prompt_tokens), output_tokens, 0.0, ignore_eos=True))

    running, usage = [], []
    for n in range(8 * output_tokens):
        if n < output_tokens and n % (output_tokens // USERS) == 0:
            send()
        step = core.next_step()
        assert step is not None
        for event in core.finish(step):
            if event.finished:
                send()
        if n >= 2 * output_tokens:
            running.append(core.num_running)
            usage.append(core.blocks.usage)
    return sum(running) / len(running), sum(usage) / len(usage)


def observation(prompt_tokens: int, output_tokens: int, running: float, kv_usage: float) -> Observation:
    return Observation(
        run="run", index=0, users=USERS, prompt_tokens=prompt_tokens, output_tokens=output_tokens,
        output_tps=100.0, tpot_p50_ms=None, ttft_p50_ms=None, e2e_p50_ms=None, tpot_mean_ms=None,
        ttft_mean_ms=None, gpu_busy=None, cpu_interval_ms=None, running_mean=running, waiting_mean=0.0,
        kv_usage_mean=kv_usage, max_num_seqs=None, measure_s=10.0, step_s=20.0, warmup_s=5.0,
    )  # fmt: skip


@pytest.mark.parametrize(("prompt_tokens", "output_tokens"), [(256, 512), (1024, 128)])
def test_the_kv_cache_size_comes_back_from_the_engines_usage(prompt_tokens: int, output_tokens: int) -> None:
    truth = SimSettings().with_flags(kv_cache_blocks=BLOCKS, block_size=16, eos_probability=0.0)
    running, kv_usage = engine_gauges(truth, prompt_tokens, output_tokens)
    assert running == pytest.approx(USERS, abs=1.0) and 0.05 < kv_usage < 1.0  # steady, below the cap and the cache
    start = SimSettings().with_flags(block_size=16)
    fitted, notes = with_engine_signals(start, [observation(prompt_tokens, output_tokens, running, kv_usage)], 1)
    assert fitted.cost.kv_cache_blocks == pytest.approx(BLOCKS, rel=0.03)
    assert any(note.startswith(f"kv_cache_blocks {fitted.cost.kv_cache_blocks} ") for note in notes)


def test_two_replicas_each_hold_half_the_running_requests() -> None:
    truth = SimSettings().with_flags(kv_cache_blocks=BLOCKS, block_size=16, eos_probability=0.0)
    running, kv_usage = engine_gauges(truth, 256, 512)
    pool = observation(256, 512, 2 * running, kv_usage)  # the pool's gauges: running summed, usage averaged
    fitted, _ = with_engine_signals(SimSettings().with_flags(block_size=16), [pool], 2)
    assert fitted.cost.kv_cache_blocks == pytest.approx(BLOCKS, rel=0.03)
