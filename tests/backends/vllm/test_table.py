"""The "in force" table from lines vLLM printed (captured from the real vLLM here)."""

from __future__ import annotations

from backends.vllm.startup_report import StartupReport
from backends.vllm.table import CANNOT, DEFAULT, IN_FORCE, NOT_REPORTED, build_rows, render
from tests.backends.vllm.captured import CONFIG_LINE, ENGINE_LINE, KV_LINE


def report() -> StartupReport:
    r = StartupReport()
    for line in ("(APIServer pid=1) INFO starting", CONFIG_LINE, ENGINE_LINE, KV_LINE):
        r.feed(line)
    return r


def test_report_reads_vllms_lines() -> None:
    r = report()
    assert r.vllm_version == "0.32.0" and r.engine_version == "V1"
    assert r.kv_cache_tokens == 1_048_576
    assert r.max_concurrency == "512.00x at 2,048 tokens per request"
    assert r.value("async_scheduling") is False
    assert r.value("slot_reuse") is True and r.value("detokenizer_async") is True


def test_statuses() -> None:
    asked = {"async_scheduling": True, "max_model_len": 2048, "dtype": "auto", "slot_reuse": False, "max_num_seqs": 64}
    rows = {r.setting: r for r in build_rows(asked, report())}
    assert rows["async_scheduling"].status == CANNOT
    assert rows["async_scheduling"].note == "the CPU backend turns async scheduling off"
    assert rows["max_model_len"].status == IN_FORCE
    assert (rows["dtype"].status, rows["dtype"].note) == (IN_FORCE, "auto resolved to float32")
    assert rows["slot_reuse"].status == CANNOT
    assert rows["max_num_seqs"].status == CANNOT and "128" in rows["max_num_seqs"].note
    assert (rows["max_num_batched_tokens"].status, rows["max_num_batched_tokens"].runs_with) == (DEFAULT, 2048)
    assert rows["enable_prefix_caching"].status == DEFAULT


def test_dtype_aliases_and_floats() -> None:
    rows = {r.setting: r for r in build_rows({"dtype": "float", "gpu_memory_utilization": 0.92}, report())}
    assert rows["dtype"].status == IN_FORCE
    assert rows["gpu_memory_utilization"].status == IN_FORCE


def test_a_vllm_that_reports_nothing_is_said_plainly() -> None:
    r = StartupReport()
    r.feed('ZEROGAP_VLLM_CONFIG {"error": "cannot hook vLLM: moved"}')
    rows = {row.setting: row for row in build_rows({"max_num_seqs": 64}, r)}
    assert rows["max_num_seqs"].status == NOT_REPORTED
    assert "passed as asked" in rows["max_num_seqs"].note
    assert "could not be read in full: cannot hook vLLM: moved" in render("t", list(rows.values()), r)


def test_render_lines_up() -> None:
    text = render("replica0", build_rows({"async_scheduling": True}, report()), report())
    line = next(x for x in text.splitlines() if "async_scheduling" in x)
    assert line.split()[:5] == ["[token_interval].async_scheduling", "true", "false", "cannot", "honour"]
    assert "KV cache: 1,048,576 tokens; maximum concurrency 512.00x" in text
