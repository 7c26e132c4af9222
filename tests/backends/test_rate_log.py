"""[logging].log_tps / log_gpu_util lines, read from a real sim's /metrics."""

from __future__ import annotations

import json
import urllib.request

from backends.rate_log import Nvml, RateLogger
from backends.sim.testing import run_sim_process
from backends.supervisor import Child, ChildSpec


def complete(url: str, max_tokens: int) -> None:
    body = {"model": "m", "prompt": "hello there", "max_tokens": max_tokens, "ignore_eos": True}
    request = urllib.request.Request(f"{url}/v1/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(request, timeout=30) as response:
        assert json.loads(response.read())["usage"]["completion_tokens"] == max_tokens


def test_output_tokens_per_second_between_two_looks_and_no_gpu_said() -> None:
    times = iter([100.0, 102.0])
    with run_sim_process(model="m") as sim:
        child = Child(ChildSpec("replica0", [], "127.0.0.1", sim.port, {}), state="up")
        rates = RateLogger([child], print, log_tps=True, log_gpu_util=True, clock=lambda: next(times))
        rates._nvml = Nvml()  # what start() makes for vLLM replicas; this machine has no GPU
        first = rates.line(child)
        for _ in range(3):
            complete(sim.url, 20)
        second = rates.line(child)
    assert first.startswith("replica0 output - tok/s (first sample), GPU n/a (")
    assert second.startswith("replica0 output 30 tok/s, GPU n/a (")  # 3 x 20 tokens in 2 s
