"""Datasets from files through the real `locust -f loadtest/` against a recording upstream: each body is
sent as the file wrote it (with the run's model and streaming on top), a ShareGPT turn's max_tokens is
its reply's length by the engine's /tokenize, in stepped concurrency and in request-rate mode; a bad
file stops the run before any request, naming its line."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from tests.fixtures.upstream import Behavior, UpstreamServer
from tests.loadtest.helpers import read_report, run_locust, write_settings

SHORT = {"steps": [3], "warmup_seconds": 0, "step_duration_seconds": 3, "measure_last_seconds": 3}


def requests_csv(run_dir: Path) -> list[dict[str, str]]:
    with (run_dir / "requests.csv").open(newline="", encoding="utf-8") as source:
        return list(csv.DictReader(source))


def test_jsonl_bodies_are_sent_as_written(tmp_path: Path) -> None:
    bodies: list[dict[str, Any]] = [
        {"messages": [{"role": "user", "content": "  first   question, spaced as written "}], "max_tokens": 5,
         "top_p": 0.5, "temperature": 0.7},
        {"messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "second"}],
         "max_completion_tokens": 3},
        {"messages": [{"role": "user", "content": "third"}], "stream_options": {"continuous_usage_stats": True}},
    ]  # fmt: skip
    dataset = tmp_path / "bodies.jsonl"
    dataset.write_text("".join(json.dumps(b) + "\n" for b in bodies), encoding="utf-8")
    with UpstreamServer(Behavior(ttft_s=0.01, interval_s=0.005), model="test-model") as up:
        settings = write_settings(
            tmp_path / "settings.json", up.url, tmp_path / "runs", "jsonl", load_test=SHORT,
            workload={"dataset": str(dataset), "dataset_order": "in_order", "max_output_tokens": 7},
        )  # fmt: skip
        result = run_locust(settings)
        seen = list(up.requests)
    assert result.returncode == 0, result.stderr[-3000:]
    assert len(seen) >= 6 and {s.path for s in seen} == {"/v1/chat/completions"}
    for s in seen:
        assert s.body["model"] == "test-model" and s.body["stream"] is True
        assert s.body["stream_options"]["include_usage"] is True
    by_first = {s.body["messages"][-1]["content"]: s for s in seen}
    assert set(by_first) == {"  first   question, spaced as written ", "second", "third"}  # as written
    first, second, third = (by_first[b["messages"][-1]["content"]].body for b in bodies)
    assert (first["max_tokens"], first["top_p"], first["temperature"]) == (5, 0.5, 0.7)
    assert second["max_completion_tokens"] == 3 and "max_tokens" not in second
    assert second["messages"] == bodies[1]["messages"]
    assert third["max_tokens"] == 7 and third["stream_options"]["continuous_usage_stats"] is True
    assert {s.num_tokens_sent for s in seen if s.finished and s.body is first} <= {5}
    report = read_report(tmp_path / "runs" / "jsonl")
    assert report["run"]["source"] == {"kind": "dataset", "path": str(dataset), "format": "openai_jsonl",
                                       "items": 3, "used": 3, "skipped": 0, "tokens_from": "dataset"}  # fmt: skip
    assert report["steps"][0]["requests_ok"] > 0 and report["steps"][0]["requests_failed"] == 0
    rows = requests_csv(tmp_path / "runs" / "jsonl")
    assert {row["line"] for row in rows} == {"1", "2", "3"}
    assert all(row["planned_s"] == "" for row in rows)  # closed loop: nothing planned


def test_sharegpt_turns_get_their_replies_token_counts_in_request_rate_mode(tmp_path: Path) -> None:
    conversations = [
        {"conversations": [{"from": "human", "value": "why is the sky blue"},
                           {"from": "gpt", "value": "because of " + "scattering " * 6}]},
        {"conversations": [{"from": "system", "value": "be brief"}, {"from": "human", "value": "hello there"},
                           {"from": "gpt", "value": "hi " * 4}, {"from": "human", "value": "and then"},
                           {"from": "gpt", "value": "then " * 9}]},
        {"conversations": [{"from": "gpt", "value": "a reply with no question"}]},
    ]  # fmt: skip
    dataset = tmp_path / "sharegpt.json"
    dataset.write_text(json.dumps(conversations, indent=2), encoding="utf-8")
    with UpstreamServer(Behavior(ttft_s=0.01, interval_s=0.002), model="test-model") as up:
        settings = write_settings(
            tmp_path / "settings.json", up.url, tmp_path / "runs", "sharegpt",
            load_test={**SHORT, "request_rate": 1, "steps": [15], "concurrency": 4, "seed": 3},
            workload={"dataset": str(dataset), "dataset_turns": "all"},
        )  # fmt: skip
        result = run_locust(settings)
        seen, num_tokenize = list(up.requests), up.state.num_tokenize
    assert result.returncode == 0, result.stderr[-3000:]
    max_tokens = {tuple(m["content"] for m in s.body["messages"]): s.body["max_tokens"] for s in seen}
    assert max_tokens == {
        ("why is the sky blue",): 8,  # the reply's words, as the upstream's /tokenize counts them
        ("be brief", "hello there"): 4,
        ("be brief", "hello there", "hi " * 4, "and then"): 9,  # the conversation as written, then its turn
    }
    assert num_tokenize >= 3
    report = read_report(tmp_path / "runs" / "sharegpt")
    assert report["run"]["source"]["tokens_from"] == "tokenize" and report["run"]["source"]["skipped"] == 1
    assert report["run"]["mode"] == "open_loop" and report["steps"][0]["send_lag_ms"]["p50"] is not None
    rows = requests_csv(tmp_path / "runs" / "sharegpt")
    assert rows and all(float(row["planned_s"]) <= float(row["sent_s"]) for row in rows)


def test_a_bad_dataset_stops_the_run_naming_the_line(tmp_path: Path) -> None:
    dataset = tmp_path / "bodies.jsonl"
    dataset.write_text('{"prompt": "fine"}\n{"prompt": "broken",\n', encoding="utf-8")
    with UpstreamServer(Behavior(), model="test-model") as up:
        settings = write_settings(
            tmp_path / "settings.json", up.url, tmp_path / "runs", "bad", workload={"dataset": str(dataset)}
        )
        result = run_locust(settings)
        assert not up.requests
    assert result.returncode == 2
    assert f"zerogap loadtest: {dataset}:2: not valid JSON" in result.stderr
