"""The shared-prefix, multi-turn workload through the real `locust -f loadtest/` against a real
sim: the report shows the engine's prefix-cache hit rate, and the prompts carry the history."""

from __future__ import annotations

from pathlib import Path

from backends.sim.testing import run_sim_process
from tests.loadtest.helpers import read_report, run_locust, write_settings


def test_prefix_groups_and_multi_turn_show_the_engines_hit_rate(tmp_path: Path) -> None:
    with run_sim_process(model="m") as sim:
        settings = write_settings(
            tmp_path / "settings.json", sim.url, tmp_path / "runs", "prefix",
            load_test={"steps": [4], "warmup_seconds": 1, "step_duration_seconds": 4, "measure_last_seconds": 3},
            workload={"model": "m", "input_tokens": 10, "max_output_tokens": 8, "prompt_tokens_from": "approx",
                      "prefix_groups": 2, "prefix_tokens": 300, "multi_turn": True, "max_turns": 4},
            metrics={"backend_metrics_urls": [sim.url + "/metrics"]},
        )  # fmt: skip
        result = run_locust(settings)
    assert result.returncode == 0, result.stderr[-3000:]
    step = read_report(tmp_path / "runs" / "prefix")["steps"][0]
    assert step["requests_ok"] > 20 and step["requests_failed"] == 0
    assert step["prefix_cache_hit_rate"] > 0.8, step["prefix_cache_hit_rate"]  # 300 shared tokens, then history
    # turn k of 4 sends the prefix, k questions (10 + nonce) and k - 1 answers (8): 322 on average
    assert 318 < step["input_tokens_mean"] < 360, step["input_tokens_mean"]
    assert "hit" in result.stdout and "prefix-cache hits" in result.stdout
