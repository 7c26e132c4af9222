"""The ranking rule (goodput under the SLOs first, output TPS only to break ties) and the lines
tune tells the user to paste: each test here fails if the rule is swapped or a field is lost."""

from __future__ import annotations

import tomllib
from typing import Any

from common.config import Config
from zerogap.tune.grid import Candidate
from zerogap.tune.rank import Result, rank
from zerogap.tune.toml_text import paste_lines


def _result(name: str, steps: list[dict[str, Any]]) -> Result:
    candidate = Candidate(settings={"scheduler.max_num_seqs": name}, config=Config())
    return Result(candidate=candidate, steps=steps, diagnosis=[])


def _names(results: list[Result]) -> list[str]:
    return [r.candidate.settings["scheduler.max_num_seqs"] for r in results]


def _step(concurrency: int, goodput_rps: float, output_tps: float) -> dict[str, Any]:
    return {"concurrency": concurrency, "goodput_rps": goodput_rps, "output_tps": output_tps}


def test_goodput_outranks_output_tps() -> None:
    fast_but_late = _result("fast", [_step(256, goodput_rps=2.0, output_tps=9000.0)])
    within_slo = _result("slo", [_step(128, goodput_rps=3.0, output_tps=4000.0)])
    assert _names(rank([fast_but_late, within_slo])) == ["slo", "fast"]


def test_output_tps_breaks_a_goodput_tie() -> None:
    slower = _result("slower", [_step(128, goodput_rps=3.0, output_tps=4000.0)])
    faster = _result("faster", [_step(128, goodput_rps=3.0, output_tps=4100.0)])
    assert _names(rank([slower, faster])) == ["faster", "slower"]


def test_a_candidates_capacity_is_its_step_with_the_most_goodput() -> None:
    result = _result("x", [_step(32, 1.0, 1000.0), _step(128, 3.0, 3000.0), _step(256, 2.0, 5000.0)])
    assert result.best_step is not None and result.best_step["concurrency"] == 128
    assert result.as_json()["best_concurrency"] == 128


def test_equal_candidates_keep_the_grid_order() -> None:
    first = _result("first", [_step(128, 3.0, 4000.0)])
    second = _result("second", [_step(128, 3.0, 4000.0)])
    assert _names(rank([first, second])) == ["first", "second"]


def test_paste_lines_keep_every_field_of_a_section() -> None:
    settings = {
        "scheduler.max_num_seqs": 128,
        "scheduler.max_num_batched_tokens": 8192,
        "scheduler.async_scheduling": True,
        "token_interval.overlap_token_interval": False,
        "engine.gpu_memory_utilization": 0.9,
    }
    parsed = tomllib.loads(paste_lines(settings))
    assert parsed == {
        "scheduler": {"max_num_seqs": 128, "max_num_batched_tokens": 8192, "async_scheduling": True},
        "token_interval": {"overlap_token_interval": False},
        "engine": {"gpu_memory_utilization": 0.9},
    }
