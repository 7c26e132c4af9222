"""The shared-prefix and multi-turn workloads, and the prefix-cache hit rate a step reports."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest

from loadreport.engine_figures import prefix_hit_rate
from loadreport.timeline import Sample
from loadtest import SettingsError, Workload, parse_settings


def workload(endpoint: str = "chat", **fields: Any) -> Workload:
    settings = parse_settings(json.dumps({"api": {"endpoint": endpoint}, "workload": {"prompt_tokens": 3, **fields}}))
    return Workload(settings, "what is it", seed=7)


def group_counts(w: Workload, num_requests: int) -> Counter[int]:
    index = {text: g for g, text in enumerate(w.prefixes)}
    counts: Counter[int] = Counter()
    session = w.session()
    for _ in range(num_requests):
        messages = json.loads(session.body("m"))["messages"]
        counts[index[messages[0]["content"]]] += 1
    return counts


def test_requests_share_one_of_g_prefixes_evenly() -> None:
    w = workload(prefix_groups=4, prefix_tokens=20)
    assert all(len(p.split()) == 20 for p in w.prefixes) and len(set(w.prefixes)) == 4
    assert w.prefixes == workload(prefix_groups=4, prefix_tokens=20).prefixes  # the same in every process
    counts = group_counts(w, 4000)
    assert all(900 <= counts[g] <= 1100 for g in range(4)), counts


def test_a_hot_prefix_takes_its_share() -> None:
    counts = group_counts(workload(prefix_groups=5, prefix_tokens=10, prefix_hot_share=0.5), 4000)
    assert 1880 <= counts[0] <= 2120, counts  # 0.5 +- 3 sigma
    assert all(400 <= counts[g] <= 600 for g in range(1, 5)), counts


def test_each_request_has_its_own_question_after_the_prefix() -> None:
    session = workload(prefix_groups=1, prefix_tokens=5).session()
    first, second = (json.loads(session.body("m"))["messages"] for _ in range(2))
    assert first[0] == second[0] and first[0]["role"] == "system"
    assert first[1]["content"] != second[1]["content"] and first[1]["content"].endswith("what is it")
    prompt = json.loads(workload("completions", prefix_groups=1, prefix_tokens=5).session().body("m"))["prompt"]
    assert prompt.startswith(workload(prefix_groups=1, prefix_tokens=5).prefixes[0] + "\n\n")


def test_multi_turn_sends_the_growing_history_and_starts_over() -> None:
    session = workload(prefix_groups=2, prefix_tokens=5, multi_turn=True, max_turns=3).session()
    turns = []
    for _ in range(4):
        turns.append(json.loads(session.body("m"))["messages"])
        session.answered(6)
    assert [len(t) for t in turns] == [2, 4, 6, 2]
    assert turns[1][:2] == turns[0] and turns[2][:4] == turns[1]  # each turn extends the last one
    assert turns[1][2]["role"] == "assistant" and len(turns[1][2]["content"].split()) == 6
    assert turns[2][0] == turns[0][0]  # one conversation keeps its prefix
    session.body("m")  # this turn fails (no answer): the next one asks again instead of stacking questions
    retry = session.body("m")
    assert [m["role"] for m in json.loads(retry)["messages"]] == ["system", "user", "assistant", "user"]


def test_prefix_settings_are_checked() -> None:
    with pytest.raises(SettingsError, match="prefix_tokens is 0"):
        parse_settings('{"workload": {"prefix_groups": 3}}')
    with pytest.raises(SettingsError, match=r"workload\.prefix_hot_share"):
        parse_settings('{"workload": {"prefix_groups": 3, "prefix_tokens": 9, "prefix_hot_share": 1.5}}')


def sample(wall: float, hits: float | None, queries: float | None) -> Sample:
    return Sample(wall, 1, None, "", None, None, None, None, prefix_cache_hits=hits, prefix_cache_queries=queries)


def test_the_hit_rate_is_the_counters_growth_inside_the_step() -> None:
    samples = [sample(9.0, 100, 1000), sample(11.0, 400, 1500), sample(15.0, 1300, 2500), sample(21.0, 0, 9000)]
    assert prefix_hit_rate(samples, 10.0, 20.0) == pytest.approx(1200 / 1500)  # from 9 s (before) to 15 s
    assert prefix_hit_rate(samples, 12.0, 20.0) == pytest.approx(900 / 1000)
    assert prefix_hit_rate(samples, 16.0, 20.0) is None  # no sample inside
    assert prefix_hit_rate([sample(11.0, None, None), sample(12.0, None, None)], 10.0, 20.0) is None
