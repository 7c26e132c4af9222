"""Dataset and trace files read as written (loadgen/datasets.py, loadgen/traces.py), and a file that
cannot be used refused with its line named."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from loadgen.dataset_source import choose, count_replies, request_payload
from loadgen.datasets import DataFileError, read_dataset
from loadgen.traces import read_trace
from loadreport.settings import parse_settings


def write_lines(path: Path, lines: list[Any]) -> Path:
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines), encoding="utf-8")
    return path


def test_jsonl_bodies_are_kept_as_written(tmp_path: Path) -> None:
    bodies: list[dict[str, Any]] = [
        {"messages": [{"role": "user", "content": "  two  spaces "}], "max_tokens": 5, "top_p": 0.5},
        {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}]},
    ]
    dataset = read_dataset(write_lines(tmp_path / "d.jsonl", [bodies[0], "", bodies[1]]), chat_endpoint=False)
    assert dataset.chat and dataset.format == "openai_jsonl"
    assert [item.line for item in dataset.items] == [1, 3]
    assert [item.turns[0].body for item in dataset.items] == bodies
    settings = parse_settings(json.dumps({"workload": {"max_output_tokens": 9, "temperature": 0.3}}))
    first = request_payload(settings, "m", dataset.items[0].turns[0].body)
    assert first["messages"] == bodies[0]["messages"] and first["max_tokens"] == 5 and first["top_p"] == 0.5
    assert first["model"] == "m" and first["stream_options"] == {"include_usage": True}
    assert request_payload(settings, "m", dataset.items[1].turns[0].body)["max_tokens"] == 9


def test_sharegpt_turns_and_their_replies(tmp_path: Path) -> None:
    conversations = [
        {"id": "a", "conversations": [{"from": "human", "value": "q1"}, {"from": "gpt", "value": "one two three"}]},
        {"id": "b", "conversations": [{"from": "gpt", "value": "no question first"}]},
        {"id": "c", "conversations": [{"from": "system", "value": "be brief"}, {"from": "human", "value": "q2"},
                                      {"from": "gpt", "value": "r2 r2"}, {"from": "human", "value": "q3"},
                                      {"from": "gpt", "value": "r3"}, {"from": "human", "value": "unanswered"}]},
    ]  # fmt: skip
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(conversations, indent=1), encoding="utf-8")
    first = read_dataset(path, chat_endpoint=True, turns="first")
    assert first.format == "sharegpt" and first.skipped == 1 and len(first.items) == 2
    assert first.items[0].turns[0].body == {"messages": [{"role": "user", "content": "q1"}]}
    every = read_dataset(path, chat_endpoint=True, turns="all")
    turns = every.items[1].turns
    assert [t.reply for t in turns] == ["r2 r2", "r3"]
    assert turns[1].body["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "q2"},
        {"role": "assistant", "content": "r2 r2"},
        {"role": "user", "content": "q3"},
    ]
    assert count_replies(every.items, lambda text: 10 * len(text.split())) == "tokenize"
    assert [t.body["max_tokens"] for t in turns] == [20, 10]  # the counter's figure, not the words
    assert count_replies(first.items, lambda text: None) == "approx"
    completions = read_dataset(path, chat_endpoint=False, turns="all")
    assert completions.items[1].turns[1].body["prompt"] == "be brief\n\nq2\n\nr2 r2\n\nq3"


def test_sampling_with_a_seed_or_in_order(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "d.jsonl", [{"prompt": f"p{i}"} for i in range(20)])
    dataset = read_dataset(path, chat_endpoint=True)
    in_order = choose(dataset, "in_order", 0, 5)
    assert [item.line for item in in_order] == [1, 2, 3, 4, 5]
    shuffled = [item.line for item in choose(dataset, "random", 7, None)]
    assert sorted(shuffled) == list(range(1, 21)) and shuffled != list(range(1, 21))
    assert shuffled == [item.line for item in choose(dataset, "random", 7, None)]  # the seed repeats it
    assert shuffled != [item.line for item in choose(dataset, "random", 8, None)]


def test_a_mooncake_trace_in_time_order(tmp_path: Path) -> None:
    rows = [{"timestamp": 27000, "input_length": 1000, "output_length": 4, "hash_ids": [0, 1]},
            {"timestamp": 27500.5, "input_length": 600, "output_length": 2, "hash_ids": [0, 2]},
            {"timestamp": 27250, "input_length": 12, "output_length": 3}]  # fmt: skip
    trace = read_trace(write_lines(tmp_path / "t.jsonl", rows))
    assert trace.format == "mooncake"
    assert [(r.line, r.at_s, r.input_tokens, r.output_tokens, r.hash_ids) for r in trace.rows] == [
        (1, 0.0, 1000, 4, (0, 1)), (3, 0.25, 12, 3, ()), (2, 0.5005, 600, 2, (0, 2))]  # fmt: skip
    assert [r.index for r in trace.rows] == [0, 1, 2]


def test_a_burstgpt_trace_skips_failed_rows(tmp_path: Path) -> None:
    path = tmp_path / "burst.csv"
    path.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                    "5,ChatGPT,472,18,490,Conversation log\n7.5,GPT-4,1087,0,1087,Conversation log\n"
                    "9.25,ChatGPT,20,30,50,API log\n", encoding="utf-8")  # fmt: skip
    trace = read_trace(path)
    assert trace.format == "burstgpt" and trace.skipped == 1
    assert [(r.line, r.at_s, r.input_tokens, r.output_tokens) for r in trace.rows] == [
        (2, 0.0, 472, 18),
        (4, 4.25, 20, 30),
    ]


BAD_JSONL = [
    ('{"messages": [{"role": "user", "content": "ok"}]}\n{"messages": [', r"d\.jsonl:2: not valid JSON"),
    ('{"messages": []}\n', r"d\.jsonl:1: messages must be a non-empty list"),
    ('{"model": "m"}\n', r"d\.jsonl:1: the body has neither of messages and prompt"),
    ('{"prompt": "a"}\n\n{"messages": [{"role": "user", "content": "b"}]}\n', r"d\.jsonl:3: a chat .* line 1 is a"),
    ('{"prompt": "a", "max_tokens": 0}\n', r"d\.jsonl:1: max_tokens must be a whole number >= 1 \(got 0\)"),
    ("\n\n", r"d\.jsonl: no request body in it"),
]


@pytest.mark.parametrize(("text", "message"), BAD_JSONL)
def test_a_bad_jsonl_names_its_line(tmp_path: Path, text: str, message: str) -> None:
    (tmp_path / "d.jsonl").write_text(text, encoding="utf-8")
    with pytest.raises(DataFileError, match=message):
        read_dataset(tmp_path / "d.jsonl", chat_endpoint=True)


BAD_SHAREGPT = [
    ('[\n {"conversations": []},\n {"conversations": [{"from": "human"}]}\n]', r"s\.json:3 \(entry 1\): .*value"),
    (
        '[\n {"conversations": [{"from": "robot", "value": "x"}]}\n]',
        r"s\.json:2 \(entry 0\): conversations\[0\]: \"from\" is \"robot\"",
    ),
    ('[\n {"conversations": [}\n]', r"s\.json:2: not valid JSON"),
    ('{"conversations": []}', r"s\.json:1: a ShareGPT file is a JSON list"),
    ('[\n {"id": 1}\n]', r"s\.json:2 \(entry 0\): each entry needs \"conversations\""),
    ('[{"conversations": [{"from": "gpt", "value": "x"}]}]', r"s\.json: no conversation has a human turn"),
]


@pytest.mark.parametrize(("text", "message"), BAD_SHAREGPT)
def test_a_bad_sharegpt_file_names_its_line(tmp_path: Path, text: str, message: str) -> None:
    (tmp_path / "s.json").write_text(text, encoding="utf-8")
    with pytest.raises(DataFileError, match=message):
        read_dataset(tmp_path / "s.json", chat_endpoint=True)


BAD_TRACES = [
    (
        "t.jsonl",
        '{"timestamp": 0, "input_length": 5, "output_length": 1}\n{"timestamp": 1}\n',
        r"t\.jsonl:2: no input_length",
    ),
    ("t.jsonl", '{"timestamp": -1, "input_length": 5, "output_length": 1}\n', r"t\.jsonl:1: timestamp must be"),
    ("t.jsonl", '{"timestamp": 0, "input_length": 5.5, "output_length": 1}\n', r"t\.jsonl:1: input_length must"),
    (
        "t.jsonl",
        '{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [1, 2, 3]}\n',
        r"t\.jsonl:1: 3 hash_ids, but input_length 600 fills only 2 blocks of 512",
    ),
    (
        "t.jsonl",
        '{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": ["a"]}\n',
        r"t\.jsonl:1: hash_ids must be a list of whole numbers",
    ),
    ("t.jsonl", "{oops\n", r"t\.jsonl:1: not valid JSON"),
    ("b.csv", "Timestamp,Request tokens\n1,2\n", r"b\.csv:1: the header has no Response tokens column"),
    ("b.csv", "Timestamp,Request tokens,Response tokens\n1,2,3\nsoon,2,3\n", r"b\.csv:3: Timestamp 'soon' is not"),
    ("b.csv", "Timestamp,Request tokens,Response tokens\n1,2.5,3\n", r"b\.csv:2: Request tokens '2.5' is not a whole"),
    ("b.csv", "Timestamp,Request tokens,Response tokens\n1,2,0\n", r"b\.csv: no request in it \(1 skipped\)"),
]


@pytest.mark.parametrize(("name", "text", "message"), BAD_TRACES)
def test_a_bad_trace_names_its_line(tmp_path: Path, name: str, text: str, message: str) -> None:
    (tmp_path / name).write_text(text, encoding="utf-8")
    with pytest.raises(DataFileError, match=message):
        read_trace(tmp_path / name)


def test_a_missing_file_says_which_setting(tmp_path: Path) -> None:
    with pytest.raises(DataFileError, match=r"nothing\.jsonl: cannot read it .*workload\.dataset"):
        read_dataset(tmp_path / "nothing.jsonl", chat_endpoint=True)
    with pytest.raises(DataFileError, match=r"nothing\.csv: cannot read it .*load_test\.trace"):
        read_trace(tmp_path / "nothing.csv")
