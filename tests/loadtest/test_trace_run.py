"""Trace replay through the real `locust -f loadtest/` against a recording upstream: each row sent once,
at its time (never before it), with its prompt built to its length from its hash_ids blocks (equal ids,
equal leading words; nothing unique before them) and its output length as max_tokens; the run ends when
the trace does; requests.csv puts each planned send beside the actual one; a generator that cannot
keep up marks the run invalid."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from tests.fixtures.upstream import Behavior, Seen, UpstreamServer
from tests.loadtest.helpers import read_report, run_locust, write_settings

ROWS = [  # timestamp ms, input_length, output_length, hash_ids (blocks of 512 tokens)
    (0, 1100, 3, [1, 2, 3]),
    (100, 700, 4, [1, 4]),
    (150, 1024, 2, [1, 2]),
    (300, 40, 5, []),
    (300, 600, 6, [5]),
    (450, 520, 7, [1, 6]),
]
SPEED = 2.0


def requests_csv(run_dir: Path) -> list[dict[str, str]]:
    with (run_dir / "requests.csv").open(newline="", encoding="utf-8") as source:
        return list(csv.DictReader(source))


def words_of(seen: Seen) -> list[str]:
    return str(seen.body["prompt"]).split()


def test_a_mooncake_trace_is_replayed_once_each_at_its_times(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps({"timestamp": t, "input_length": i, "output_length": o, "hash_ids": h}) + "\n"
                             for t, i, o, h in ROWS), encoding="utf-8")  # fmt: skip
    with UpstreamServer(Behavior(ttft_s=0.01, interval_s=0.005), model="test-model") as up:
        settings = write_settings(
            tmp_path / "settings.json", up.url, tmp_path / "runs", "trace", api={"endpoint": "completions"},
            load_test={"trace": str(trace), "trace_speed": SPEED, "concurrency": 8},
        )  # fmt: skip
        result = run_locust(settings)
        seen = list(up.requests)
    assert result.returncode == 0, result.stderr[-3000:]
    assert len(seen) == len(ROWS) and {s.path for s in seen} == {"/v1/completions"}  # once each
    by_row = {}
    for s in seen:
        row = next(r for r, (_, i, o, _) in enumerate(ROWS) if (i, o) == (len(words_of(s)), s.body["max_tokens"]))
        by_row[row] = words_of(s)  # each row's prompt has its length and its output length as max_tokens
    assert sorted(by_row) == list(range(len(ROWS)))
    assert by_row[0][:1024] == by_row[2]  # blocks 1, 2
    assert by_row[0][:512] == by_row[1][:512] == by_row[5][:512]  # block 1
    assert by_row[0][512:700] != by_row[1][512:700] and by_row[0][512:520] != by_row[5][512:520]
    assert by_row[0][1024:] == by_row[0][1024:1100] and len(by_row[0][1024:]) == 76  # a short last block
    firsts = {tuple(words[:16]) for words in by_row.values()}
    assert len(firsts) == 3  # block 1 (rows 0, 1, 2, 5), row 3's own words, block 5: nothing unique before
    report = read_report(tmp_path / "runs" / "trace")
    start = report["run"]["started_unix_s"]
    planned = {line: ROWS[line - 1][0] / 1000 / SPEED for line in range(1, len(ROWS) + 1)}
    rows = requests_csv(tmp_path / "runs" / "trace")
    assert sorted(int(r["line"]) for r in rows) == list(range(1, len(ROWS) + 1))
    for r in rows:
        assert abs(float(r["planned_s"]) - planned[int(r["line"])]) < 1e-5, r
        assert float(r["sent_s"]) >= float(r["planned_s"]), r  # never before its time
        assert r["prompt_tokens"] == r["trace_input_tokens"] and r["output_tokens"] == r["trace_output_tokens"]
    for s in seen:  # the upstream saw none before its planned time
        line = next(int(r["line"]) for r in rows if int(r["trace_input_tokens"]) == len(words_of(s))
                    and int(r["trace_output_tokens"]) == s.body["max_tokens"])  # fmt: skip
        assert s.arrived_wall >= start + planned[line]
    step = report["steps"][0]
    assert step["requests_ok"] == len(ROWS) and step["complete"] and step["send_lag_ms"]["p50"] is not None
    assert step["end_s"] < 30  # the run ended with the trace, not at its longest bound (api.timeout_seconds)
    last_answer_s = max(float(r["sent_s"]) + float(r["e2e_ms"]) / 1000 for r in rows)
    assert last_answer_s <= step["end_s"] <= last_answer_s + 0.1 + 1e-3  # at its last answer, not the next tick
    assert report["run"]["source"] == {"kind": "trace", "path": str(trace), "format": "mooncake", "items": 6,
                                       "used": 6, "skipped": 0, "tokens_from": "tokenize", "trace_speed": SPEED,
                                       "span_s": 0.225}  # fmt: skip


def test_a_burstgpt_trace_that_the_generator_cannot_keep_up_with_is_invalid(tmp_path: Path) -> None:
    trace = tmp_path / "burst.csv"
    lines = ["Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type"]
    lines += [f"{10 + i * 0.001:.3f},ChatGPT,{20 + i},{2 + i % 3},0,Conversation log" for i in range(10)]
    lines.append("10.5,GPT-4,30,0,30,Conversation log")  # failed in the original service: skipped
    trace.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with UpstreamServer(Behavior(ttft_s=0.1, interval_s=0.001), model="test-model") as up:
        settings = write_settings(
            tmp_path / "settings.json", up.url, tmp_path / "runs", "late", api={"endpoint": "completions"},
            load_test={"trace": str(trace), "concurrency": 1},  # one user: each send waits for the last answer
        )  # fmt: skip
        result = run_locust(settings)
        seen = list(up.requests)
    assert result.returncode == 0, result.stderr[-3000:]
    assert sorted((len(words_of(s)), s.body["max_tokens"]) for s in seen) == [(20 + i, 2 + i % 3) for i in range(10)]
    assert len({tuple(words_of(s)[:8]) for s in seen}) == 10  # no blocks: every prompt its own
    report = read_report(tmp_path / "runs" / "late")
    step = report["steps"][0]
    assert not step["valid"] and "send lag p90" in step["invalid_reason"], step["invalid_reason"]
    assert step["send_lag_ms"]["p90"] >= 700  # the 9th send waited for 8 answers of 100 ms or more
    assert report["diagnosis"][0]["limit"] in ("load_generator", "errors")
    assert report["run"]["source"]["format"] == "burstgpt" and report["run"]["source"]["skipped"] == 1
    lags = [float(r["send_lag_ms"]) for r in requests_csv(tmp_path / "runs" / "late")]
    assert lags == sorted(lags) and lags[-1] >= 900  # planned beside actual: the lag grows row by row


SHARED_ROWS = [(40 * k, 520 + 7 * k, 2 + k % 4, [1, 100 + k] if k % 3 else [2]) for k in range(12)]


def test_a_trace_is_shared_by_worker_processes_from_one_time_0(tmp_path: Path) -> None:
    """--processes 2: each row sent once, by one of the workers, at its time from the master's time 0 (a
    worker's own start would shift its planned sends); requests.csv one row per trace row; the step ends
    at the last answer (not when the master next hears from its workers)."""
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps({"timestamp": t, "input_length": i, "output_length": o, "hash_ids": h}) + "\n"
                             for t, i, o, h in SHARED_ROWS), encoding="utf-8")  # fmt: skip
    with UpstreamServer(Behavior(ttft_s=0.01, interval_s=0.005), model="test-model") as up:
        settings = write_settings(
            tmp_path / "settings.json", up.url, tmp_path / "runs", "shared", api={"endpoint": "completions"},
            load_test={"trace": str(trace), "concurrency": 8},
        )  # fmt: skip
        result = run_locust(settings, "--processes", "2", timeout_s=120)
        seen = list(up.requests)
    assert result.returncode == 0, result.stderr[-3000:]
    lengths = [(i, o) for _, i, o, _ in SHARED_ROWS]
    assert sorted((len(words_of(s)), s.body["max_tokens"]) for s in seen) == sorted(lengths)  # each row once
    report = read_report(tmp_path / "runs" / "shared")
    assert report["run"]["num_worker_processes"] == 2
    assert report["run"]["source"]["kind"] == "trace" and report["run"]["source"]["items"] == len(SHARED_ROWS)
    assert report["run"]["source"]["tokens_from"] == "tokenize"  # as the workers counted it
    start = report["run"]["started_unix_s"]
    rows = requests_csv(tmp_path / "runs" / "shared")
    assert sorted(int(r["line"]) for r in rows) == list(range(1, len(SHARED_ROWS) + 1))
    for r in rows:
        at_s = SHARED_ROWS[int(r["line"]) - 1][0] / 1000
        assert abs(float(r["planned_s"]) - at_s) < 1e-5, r  # the master's time 0, in both workers
        assert float(r["sent_s"]) >= float(r["planned_s"]), r
        assert (int(r["trace_input_tokens"]), int(r["trace_output_tokens"])) == lengths[int(r["line"]) - 1]
    for s in seen:
        line = lengths.index((len(words_of(s)), s.body["max_tokens"])) + 1
        assert s.arrived_wall >= start + SHARED_ROWS[line - 1][0] / 1000  # never before its time
    step = report["steps"][0]
    assert step["requests_ok"] == len(SHARED_ROWS) and step["complete"]
    last_answer_s = max(float(r["sent_s"]) + float(r["e2e_ms"]) / 1000 for r in rows)
    assert last_answer_s <= step["end_s"] <= last_answer_s + 0.1 + 1e-3, (last_answer_s, step["end_s"])


def test_a_slow_trace_is_sent_by_few_users_on_connections_kept_alive(tmp_path: Path) -> None:
    """40 rows 50 ms apart, each answered in a few ms, with a pool of 32 users: the users freed last
    take the next rows (as a connection pool hands out the connection used last), so the requests come
    on a few kept-alive connections, not one new connection per user (its connect in the TTFT)."""
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps({"timestamp": 50 * i, "input_length": 16, "output_length": 2}) + "\n"
                             for i in range(40)), encoding="utf-8")  # fmt: skip
    with UpstreamServer(Behavior(ttft_s=0.002, interval_s=0.001), model="test-model") as up:
        settings = write_settings(
            tmp_path / "settings.json", up.url, tmp_path / "runs", "few", api={"endpoint": "completions"},
            load_test={"trace": str(trace), "concurrency": 32},
        )  # fmt: skip
        result = run_locust(settings, timeout_s=120)
        seen = list(up.requests)
    assert result.returncode == 0, result.stderr[-3000:]
    assert len(seen) == 40
    connections = {s.client_port for s in seen}
    # the 4 users that hold a row while it waits, and the few in flight: a user per row would be 32
    assert None not in connections and len(connections) <= 12, len(connections)
