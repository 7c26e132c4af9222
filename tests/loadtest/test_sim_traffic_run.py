"""The real `locust -f loadtest/` against a real sim: a reasoning model's TTFT (its first reasoning token)
and time to first answer token apart by the time the sim spent on the reasoning tokens it was given;
a trace whose rows share a block shows the engine's cached prompt tokens per request and per step."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from backends.sim.testing import run_sim_process
from tests.loadtest.helpers import read_report, run_locust, write_settings

REASONING = 4


def test_a_reasoning_model_s_first_answer_token_comes_its_reasoning_later(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text(f"[sim]\nreasoning_tokens = {REASONING}\nforward_fixed_ms = 20.0\n", encoding="utf-8")
    with run_sim_process(model="m", config=config) as sim:
        settings = write_settings(
            tmp_path / "settings.json", sim.url, tmp_path / "runs", "reasoning",
            load_test={"steps": [2], "warmup_seconds": 1, "step_duration_seconds": 4, "measure_last_seconds": 3},
            workload={"model": "m", "input_tokens": 10, "max_output_tokens": 10, "prompt_tokens_from": "approx"},
            metrics={"backend_metrics_urls": []},
        )  # fmt: skip
        result = run_locust(settings)
    assert result.returncode == 0, result.stderr[-3000:]
    step = read_report(tmp_path / "runs" / "reasoning")["steps"][0]
    assert step["requests_ok"] >= 5 and step["requests_failed"] == 0
    assert step["reasoning_tokens_mean"] == REASONING  # from usage.completion_tokens_details
    assert step["output_tokens_mean"] == 10  # reasoning and answer: TPOT is over both
    # TTFT is the first reasoning token; the first answer token comes REASONING tokens later, one per step
    steps_apart = step["reasoning_ms"]["p50"] / step["itl_ms"]["p50"]
    assert round(steps_apart) == REASONING, (step["reasoning_ms"], step["itl_ms"])
    gap = step["ttfa_ms"]["p50"] - step["ttft_ms"]["p50"]
    assert round(gap / step["itl_ms"]["p50"]) == REASONING, (step["ttfa_ms"], step["ttft_ms"], step["itl_ms"])


def test_a_trace_s_shared_blocks_show_as_cached_tokens(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    rows = [{"timestamp": 400 * i, "input_length": 542, "output_length": 4, "hash_ids": [1, 100 + i]} for i in range(4)]
    trace.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    with run_sim_process(model="m") as sim:
        settings = write_settings(
            tmp_path / "settings.json", sim.url, tmp_path / "runs", "cached", api={"endpoint": "completions"},
            load_test={"trace": str(trace), "concurrency": 4}, workload={"model": "m"},
            metrics={"backend_metrics_urls": [sim.url + "/metrics"]},
        )  # fmt: skip
        result = run_locust(settings)
    assert result.returncode == 0, result.stderr[-3000:]
    report = read_report(tmp_path / "runs" / "cached")
    with (tmp_path / "runs" / "cached" / "requests.csv").open(newline="", encoding="utf-8") as source:
        requests = {int(r["line"]): r for r in csv.DictReader(source)}
    assert sorted(requests) == [1, 2, 3, 4] and all(r["prompt_tokens"] == "542" for r in requests.values())
    assert requests[1]["cached_tokens"] in ("", "0")  # the first to send block 1 finds nothing cached
    cached = [int(requests[line]["cached_tokens"]) for line in (2, 3, 4)]
    assert all(512 <= c < 542 for c in cached), cached  # block 1 (512 tokens), not the row's own 30
    step = report["steps"][0]
    assert step["cached_tokens_mean"] == round(sum(cached) / 4, 3)
    assert step["cached_prompt_share"] == round(sum(cached) / (4 * 542), 4)
    assert step["prefix_cache_hit_rate"] is not None and step["prefix_cache_hit_rate"] > 0.5
