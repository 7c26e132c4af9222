"""`zerogap tune`'s estimate of its own time: its parts follow the trial (exactly, where they can),
and the run prints it. How close it comes to the time taken is a timing figure, measured by
bench/tune_virtual.py."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from common.config import parse_config
from common.config.model import Config
from zerogap.tune.cli import main as tune_main
from zerogap.tune.estimate import (
    HARNESS_REPORT_S,
    HARNESS_START_S,
    STARTUP_S,
    STOP_S,
    TUNE_REPORT_S,
    estimate,
)
from zerogap.tune.grid import candidates, parse_axis
from zerogap.tune.trial import Trial

# held long enough that the run's fixed time, not the machine's load, is most of it
REAL = Trial("sim", (8, 16), 10.0, 6.0, 2.0, 64, 16, 5000.0, 500.0)
VIRTUAL = Trial("sim", (32, 128), 10.0, 6.0, 2.0, 128, 64, 2000.0, 100.0, virtual=True)


def sim_config(text: str = "") -> Config:
    return parse_config(text, env={})


def test_real_time_parts_follow_the_trial() -> None:
    one = estimate(REAL, [Config()])
    part = one.candidates[0]
    assert part.load_s == REAL.warmup_s + REAL.step_s * len(REAL.steps) == 22.0
    assert (part.start_s, part.stop_s) == (STARTUP_S["sim"], STOP_S["sim"])
    assert part.harness_s == HARNESS_START_S + HARNESS_REPORT_S
    assert one.total_s == pytest.approx(part.total_s + TUNE_REPORT_S)
    three = estimate(REAL, [Config()] * 3)
    assert three.total_s == pytest.approx(3 * part.total_s + TUNE_REPORT_S)
    longer = estimate(replace(REAL, steps=(8, 16, 32), step_s=20.0, warmup_s=5.0), [Config()]).candidates[0]
    assert longer.load_s == 65.0 and longer.total_s - part.total_s == pytest.approx(43.0)
    window = estimate(replace(REAL, measure_s=1.0), [Config()])
    assert window.total_s == one.total_s  # the measure window is the end of the step: no extra time
    vllm = estimate(replace(REAL, engine="vllm"), [Config()]).candidates[0]
    assert vllm.start_s == STARTUP_S["vllm"] > part.start_s and vllm.load_s == part.load_s


def test_virtual_time_follows_the_model_of_each_candidate() -> None:
    base = estimate(VIRTUAL, [sim_config()]).candidates[0]
    assert base.start_s == base.harness_s == base.stop_s == 0.0 and base.load_s > 0
    twice = estimate(replace(VIRTUAL, step_s=20.0), [sim_config()]).candidates[0]
    assert twice.load_s == pytest.approx(2 * base.load_s)  # twice the virtual time, twice the engine steps
    slower = estimate(VIRTUAL, [sim_config("[sim]\ntime_scale = 4")]).candidates[0]
    assert slower.load_s == pytest.approx(base.load_s / 4)  # 4x longer engine steps: a quarter of them
    capped = estimate(VIRTUAL, [sim_config("[scheduler]\nmax_num_seqs = 16")]).candidates[0]
    assert capped.load_s < base.load_s / 2  # 16 sequences advance per step, not 32 and 128
    parts = [estimate(replace(VIRTUAL, steps=(c,)), [sim_config()]).candidates[0].load_s for c in VIRTUAL.steps]
    assert base.load_s == pytest.approx(sum(parts))


def test_virtual_tune_prints_its_estimate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The estimate printed before the run is the one computed from the trial. How close it is to
    the time taken is a timing figure: bench/tune_virtual.py prints it ("took / estimated")."""
    grid = ["max_num_seqs=16,128", "async_scheduling=false,true"]
    expected = estimate(VIRTUAL, [c.config for c in candidates(Config(), [parse_axis(g) for g in grid])])
    argv = ["--engine", "sim", "--virtual", "--grid", grid[0], "--grid", grid[1], "--steps", "32,128"]
    argv += ["--step-seconds", "10", "--measure-seconds", "6", "--warmup-seconds", "2", "--out", str(tmp_path / "v")]
    assert tune_main(argv) == 0
    printed = capsys.readouterr().out
    assert f"about {expected.total_s:.0f} s in all" in printed
