"""vLLM's own client and the harness agree on one simulated engine at 32 streams
(tests/backends/vllm/bench_agreement.py says how). The real vLLM's turn is in
test_real_vllm.py, which starts the tiny model once for the tier.

The sim runs at --time-scale 5 (a step of ~46 ms at 32 streams): a closed loop's TTFT is
two steps minus the client's turnaround (the time from a stream's last token to its next
request); at time scale 1 (9 ms steps) a few ms of turnaround on a busy machine would be
more than 5% of it, for either client.

It runs in the real-vLLM tier, alone on the machine: in the fast tier (4 workers) its TTFT read 6.7%
apart once (clean CI, 2026-12-03), though it held beside two busy loops (TPS 2.3%, TTFT 1%, TPOT 0.5%).
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from backends.tiny_model import build_tiny_model
from common.net import free_port, wait_http_ok
from common.process_group import stop_process
from tests.backends.vllm.bench_agreement import Load, compare
from tests.backends.vllm.pool import SETUP_TIMEOUT_S, vllm_interpreter
from tests.support import zerogap_cmd

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(SETUP_TIMEOUT_S + 300)]  # may install vLLM

MODEL = "tiny-llama"
SIM_LOAD = Load(streams=32, output_tokens=32, requests_per_stream=12, step_s=18)


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[str]:
    (tmp_path / "sim.toml").write_text("# every [sim] and [engine] setting at its default\n")
    port = free_port()
    cmd = zerogap_cmd("sim", "--config", str(tmp_path / "sim.toml"), "--port", str(port), "--model", MODEL)
    proc = subprocess.Popen([*cmd, "--time-scale", "5"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_http_ok(f"http://127.0.0.1:{port}/v1/models", 120)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_process(proc)


def test_vllm_bench_serve_and_the_harness_agree_on_the_sim(sim: str, tmp_path: Path) -> None:
    tokenizer = build_tiny_model(tmp_path / "tiny")  # vLLM's client needs a tokenizer to make its prompts
    compare(vllm_interpreter(), sim, MODEL, tokenizer, SIM_LOAD, tmp_path / "run")
