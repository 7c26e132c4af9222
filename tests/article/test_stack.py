"""The article's files driving a real stack: the sim behind the gateway, both from the
article's config.toml, and `locust -f loadtest/` from its settings.json (short runs)."""

from __future__ import annotations

import csv
import json
import re
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from common.net import free_port, wait_for_port
from common.process_group import stop_process
from tests.article.stack import MODEL, SECRET, Stack, article_settings, article_stack, write_json
from tests.loadtest.helpers import LOCUST, locust_cmd, read_report
from tests.render import inspect_page
from tests.support import REPO


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with article_stack(tmp_path_factory.mktemp("article")) as running:
        yield running


def run(stack: Stack, name: str, env: dict[str, str] | None = None, **sections: dict[str, Any]) -> tuple[
    subprocess.CompletedProcess[str], Path
]:  # fmt: skip
    settings = article_settings(stack.base_url, stack.workdir / "runs", name, **sections)
    path = write_json(stack.workdir / f"{name}.json", settings)
    done = subprocess.run(locust_cmd(path), cwd=REPO, env=env or stack.env(), capture_output=True, text=True,
                          timeout=90, check=False)  # fmt: skip
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    return done, stack.workdir / "runs" / name


def test_streamed_no_steps_no_model(stack: Stack) -> None:
    """The article's settings as written: one step at concurrency, the model from /v1/models."""
    done, run_dir = run(stack, "streamed", metrics={"backend_metrics_urls": [stack.sim_metrics]})
    assert done.returncode == 0, done.stderr[-3000:]
    report = read_report(run_dir)
    assert report["run"]["model"] == MODEL
    (step,) = report["steps"]
    assert step["concurrency"] == 8 and step["requests_ok"] > 0 and step["requests_failed"] == 0
    assert step["output_tps"] > 0 and step["ttft_ms"]["p50"] and step["tpot_ms"]["p50"] and step["itl_ms"]["p50"]
    assert step["gpu_util"] is not None and step["not_collected"] == {}
    assert step["ttft_ms"]["p50"] < step["e2e_ms"]["p50"]


def test_not_streamed_with_steps(stack: Stack) -> None:
    done, run_dir = run(
        stack, "whole", workload={"stream": False},
        load_test={"steps": [2, 4], "step_duration_seconds": 3, "measure_last_seconds": 2},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    steps = read_report(run_dir)["steps"]
    assert [s["concurrency"] for s in steps] == [2, 4]
    for step in steps:
        assert step["requests_ok"] > 0 and step["token_count_source"] == "usage" and step["output_tps"] > 0
        assert step["tpot_ms"] is None and step["itl_ms"] is None
        assert "workload.stream is false" in step["tpot_ms_reason"]
        assert step["ttft_ms"]["p50"] == step["e2e_ms"]["p50"]  # the answer's first byte is its last
    assert "TPOT" not in done.stdout.split("zerogap step 1/2")[1].splitlines()[0]


def test_collect_false_leaves_the_metric_out(stack: Stack) -> None:
    off = {f"collect_{name}": False for name in ("tps", "ttft", "tpot", "gpu_util")}
    done, run_dir = run(stack, "off", metrics={**off, "backend_metrics_urls": [stack.sim_metrics]})
    assert done.returncode == 0, done.stderr[-3000:]
    (step,) = read_report(run_dir)["steps"]
    for key in ("output_tps", "total_tps", "ttft_ms", "tpot_ms", "itl_ms", "gpu_util"):
        assert step[key] is None and key in step["not_collected"], key
    assert step["gpu_util_reason"] == "metrics.collect_gpu_util is false"
    with (run_dir / "timeline.csv").open(newline="") as handle:
        timeline = list(csv.DictReader(handle))
    assert timeline and {row["output_tps"] + row["ttft_p50_ms"] + row["tpot_p50_ms"] + row["gpu_util"]
                         for row in timeline} == {""}  # fmt: skip
    assert step["requests_ok"] > 0 and step["e2e_ms"]["p50"]
    line = next(x for x in done.stdout.splitlines() if x.startswith("zerogap step 1/1"))
    assert "tok/s" not in line and "TTFT" not in line and "GPU" not in line


@pytest.mark.parametrize(
    ("case", "advice"),
    [
        # 401 last: its 20 wrong keys make the gateway answer this address 429 for 10 s, except for a
        # key that authenticated from it before (the 404 case's right key)
        ("404", "ends at /api"),
        ("refused", "Check api.base_url"),
        ("401", "`echo $TAOTOKEN_API_KEY`"),
    ],
)
def test_fail_fast_prints_the_articles_advice(stack: Stack, case: str, advice: str) -> None:
    sections: dict[str, dict[str, Any]] = {"load_test": {"duration_seconds": 30}}
    env = stack.env()
    if case == "401":
        env["TAOTOKEN_API_KEY"] = "sk-wrong"
        sections["workload"] = {"model": MODEL}
    elif case == "404":
        sections["workload"] = {"model": "no-such-model"}
    else:
        sections["api"] = {"base_url": f"http://127.0.0.1:{free_port()}/api", "max_retries": 1}
        sections["workload"] = {"model": MODEL}
    started = time.monotonic()
    done, run_dir = run(stack, f"fail-{case}", env=env, **sections)
    assert time.monotonic() - started < 25  # stopped long before the 31 s planned
    assert done.returncode == 1, done.stderr[-3000:]
    assert "the first 20 requests all failed with" in done.stderr and advice in done.stderr, done.stderr[-3000:]
    if case == "404":
        assert f"offers: {MODEL}" in done.stderr and "does not exist" in done.stderr
    assert "Fix: " in read_report(run_dir)["run"]["stopped_early"]


def test_backends_and_gateway_log_their_rates(stack: Stack) -> None:
    """[logging].log_tps / log_gpu_util: lines per replica (tok/s > 0 under load, the sim's busy
    ratio) from `zerogap backends up`, and the gateway's relayed tok/s."""
    if not (stack.workdir / "runs" / "streamed").exists():
        test_streamed_no_steps_no_model(stack)
    time.sleep(1.5)
    backends = stack.backends_log.read_text(errors="replace")
    assert "overlap_token_interval = async_scheduling = true" in backends and "mode async+slot_reuse" in backends
    assert "tensor_parallel_size = 4, pipeline_parallel_size = 1: the sim models one engine" in backends
    busy = re.findall(r"replica0 output ([\d,]+) tok/s, GPU (\d+)% \(sim busy ratio\)", backends)
    assert busy and max(int(tps.replace(",", "")) for tps, _ in busy) > 0, backends[-2000:]
    assert max(int(gpu) for _, gpu in busy) > 0
    relayed = re.findall(r"relayed ([\d,]+) output tok/s", stack.gateway_log.read_text(errors="replace"))
    assert relayed and max(int(x.replace(",", "")) for x in relayed) > 0


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


def _gateway_requests(stack: Stack) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{stack.gateway_port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("zerogap_requests_total"))


def _ui_requests(web: str) -> tuple[float, dict[str, Any]]:
    stats = _get_json(f"{web}/stats/requests")
    total = next(row for row in stats["stats"] if row["name"] == "Aggregated")
    return float(total["num_requests"]), stats


def test_web_ui_counts_requests_only_and_shows_the_zerogap_tab(stack: Stack) -> None:
    """Locust's own table counts requests (no TTFT/TPOT rows): its request rate is the gateway's.
    The zerogap tab holds the per-step figures and renders in headless Chromium."""
    settings = article_settings(stack.base_url, stack.workdir / "runs", "ui", load_test={"duration_seconds": 12},
                                metrics={"backend_metrics_urls": [stack.sim_metrics]})  # fmt: skip
    path = write_json(stack.workdir / "ui.json", settings)
    port = free_port()
    web = f"http://127.0.0.1:{port}"
    cmd = [LOCUST, "-f", str(REPO / "loadtest"), "--settings", str(path), "--web-host", "127.0.0.1",
           "--web-port", str(port), "--autostart", "--autoquit", "1"]  # fmt: skip
    log = stack.workdir / "ui.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen(cmd, cwd=REPO, env=stack.env(), stdout=sink, stderr=subprocess.STDOUT)
    try:
        wait_for_port(port, timeout_s=120, proc=proc)
        time.sleep(3.0)  # past the warm-up: every user streams
        ui_before, gateway_before = _ui_requests(web)[0], _gateway_requests(stack)
        time.sleep(4.0)
        (ui_after, stats), gateway_after = _ui_requests(web), _gateway_requests(stack)
        page = inspect_page(f"{web}/?tab=zerogap", wait_ms=4000)
    finally:
        stop_process(proc)
    assert "Traceback" not in log.read_text(errors="replace")
    assert {row["method"] for row in stats["stats"] if row["name"] != "Aggregated"} == {"POST"}
    ui_rate, gateway_rate = ui_after - ui_before, gateway_after - gateway_before
    assert gateway_rate > 20 and abs(ui_rate - gateway_rate) <= 0.10 * gateway_rate, (ui_rate, gateway_rate)
    (tab,) = [table for table in stats["extended_stats"] if table["key"] == "zerogap"]
    steps = {row["step"]: row for row in tab["data"]}
    assert steps["1/1"]["users"] == 8 and steps["1/1"]["output_tps"] > 0 and steps["1/1"]["tpot_p50_ms"] > 0
    for title in ("Output tok/s", "TTFT p50 ms", "TTFT p99 ms", "TPOT p50 ms", "GPU util %", "Failures"):
        assert title in page.dom, title
    assert ">1/1<" in page.dom and ">warm-up<" in page.dom


def test_the_articles_curl(stack: Stack) -> None:
    """The article's curl, with its host changed: a streamed chat completion through the gateway."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hello"}], "stream": True, "max_tokens": 8}
    cmd = ["curl", "-sS", "-N", f"{stack.base_url}/v1/chat/completions", "-H", f"Authorization: Bearer {SECRET}",
           "-H", "Content-Type: application/json", "-d", json.dumps(body)]  # fmt: skip
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)
    except FileNotFoundError:
        pytest.fail("curl is not installed: apt-get install -y curl")
    assert done.returncode == 0, done.stderr
    events = [line for line in done.stdout.splitlines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]" and len(events) >= 3, done.stdout[-2000:]
    assert json.loads(events[0].removeprefix("data: "))["model"] == MODEL
