"""[logging].log_tps / log_gpu_util: while the pool runs, one line per replica every
[logging].log_interval_s with its output tokens/s (from vllm:generation_tokens_total,
which vLLM and the sim both export) and its GPU utilization: NVML over the replica's
GPUs (CUDA_VISIBLE_DEVICES), or the sim's modelled busy ratio (zerogap_sim_gpu_busy_ratio).

    zerogap backends: replica0 output 3,412 tok/s, GPU 97% (sim busy ratio)
"""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from backends.supervisor import Child

GENERATION_TOKENS = "vllm:generation_tokens_total"
SIM_BUSY = "zerogap_sim_gpu_busy_ratio"
SCRAPE_TIMEOUT_S = 2.0


def scrape(url: str, names: set[str]) -> dict[str, float]:
    """Each wanted metric summed over its labels; {} when the server does not answer."""
    try:
        with urllib.request.urlopen(url, timeout=SCRAPE_TIMEOUT_S) as response:
            text = response.read().decode("utf-8", "replace")
    except (OSError, urllib.error.URLError):
        return {}
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in names:
                found[sample.name] = found.get(sample.name, 0.0) + float(sample.value)
    return found


class Nvml:
    """GPU utilization in percent of a replica's devices, by NVML (None when there is no driver)."""

    def __init__(self) -> None:
        self.error = ""
        self.module: Any = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self.module = pynvml
        except Exception as exc:  # no driver, no library: no GPU
            self.error = str(exc) or type(exc).__name__

    def util_percent(self, devices: list[int]) -> float | None:
        if self.module is None or not devices:
            return None
        try:
            rates = [
                float(self.module.nvmlDeviceGetUtilizationRates(self.module.nvmlDeviceGetHandleByIndex(i)).gpu)
                for i in devices
            ]
        except Exception as exc:  # an NVMLError
            self.error = str(exc)
            return None
        return sum(rates) / len(rates)


def gpu_devices(child: Child) -> list[int]:
    visible = child.spec.env.get("CUDA_VISIBLE_DEVICES", "")
    return [int(d) for d in visible.split(",") if d.strip().isdigit()]


@dataclass
class _Last:
    tokens: float
    at_s: float


@dataclass
class RateLogger:
    """Prints the lines from its own thread until stop(); `say` prefixes "zerogap backends: "."""

    children: list[Child]
    say: Callable[[str], None]
    interval_s: float = 10.0
    log_tps: bool = True
    log_gpu_util: bool = False
    sim: bool = False
    clock: Callable[[], float] = time.monotonic
    _last: dict[str, _Last] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _nvml: Nvml | None = None

    def start(self) -> threading.Thread:
        if self.log_gpu_util and not self.sim:
            self._nvml = Nvml()
        thread = threading.Thread(target=self._loop, name="zerogap-rate-log", daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            for child in self.children:
                if child.state == "up":
                    line = self.line(child)
                    if line:
                        self.say(line)

    def line(self, child: Child) -> str:
        values = scrape(child.spec.url + "/metrics", {GENERATION_TOKENS, SIM_BUSY})
        parts = []
        if self.log_tps:
            parts.append(self._tps(child, values))
        if self.log_gpu_util:
            parts.append(self._gpu(child, values))
        return f"{child.spec.name} " + ", ".join(part for part in parts if part)

    def _tps(self, child: Child, values: dict[str, float]) -> str:
        tokens, now = values.get(GENERATION_TOKENS), self.clock()
        if tokens is None:
            return f"output tok/s unknown ({child.spec.url}/metrics has no {GENERATION_TOKENS})"
        last = self._last.get(child.spec.name)
        self._last[child.spec.name] = _Last(tokens, now)
        if last is None or tokens < last.tokens or now <= last.at_s:  # first look, or the replica restarted
            return "output - tok/s (first sample)"
        return f"output {(tokens - last.tokens) / (now - last.at_s):,.0f} tok/s"

    def _gpu(self, child: Child, values: dict[str, float]) -> str:
        if self.sim:
            busy = values.get(SIM_BUSY)
            return "GPU unknown" if busy is None else f"GPU {busy * 100:.0f}% (sim busy ratio)"
        assert self._nvml is not None
        util = self._nvml.util_percent(gpu_devices(child))
        if util is None:
            why = self._nvml.error or "no GPU assigned (vLLM's CPU backend)"
            return f"GPU n/a ({why})"
        return f"GPU {util:.0f}% (NVML)"
