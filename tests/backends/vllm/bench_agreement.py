"""vLLM's own load client (`vllm bench serve`, from the vLLM environment through
backends/vllm/entry.py --vllm-cli) and the harness (the real Locust run) against one
server, one after the other, with the same closed loop: the same streams, prompt and
output lengths (ignore_eos), chat endpoint. Their output TPS, TTFT p50 and TPOT p50 must
agree within 5%.

Both ramp the streams up over a second (`--request-rate` with `--max-concurrency`; the
harness's `spawn_rate`): started all at once, the streams would stay in lockstep, the
engine would run empty between waves, and TTFT would hang on each client's own turnaround.
(Locust alone starts floor(spawn_rate) users at once: until the harness spaced them, it read
TTFT 3-6% and the sim's token interval 1% over vLLM's client, the server's own histograms
agreeing: the engine's steps were fuller, not the harness's clock late.)
vLLM's client reports over its whole run (ramp and tail included); the harness over its
step's steady window: enough requests per stream keep the ramp's share small.
"""

from __future__ import annotations

import json
import subprocess
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from backends.vllm.command import ENTRY
from backends.vllm.entry import CLI_FLAG
from tests.loadtest.helpers import check_few_failed, read_report, run_locust, write_settings

TOLERANCE = 0.05


@dataclass(frozen=True)
class Load:
    streams: int
    output_tokens: int
    requests_per_stream: int  # vLLM's client: num_prompts = streams x this
    step_s: int  # the harness: its one step (measured over all but its first 2 s), after 2 s of warm-up
    # The harness's failed requests allowed, as a share: none against the sim; real vLLM on 2
    # busy cores now and then drops a connection or sends an empty stream (1 of 371, CI 2026-12-03).
    failed_share_ok: float = 0.0


@dataclass(frozen=True)
class Figures:
    output_tps: float
    ttft_p50_ms: float
    tpot_p50_ms: float
    prompt_tokens_mean: float


def vllm_bench(python: str, base_url: str, model: str, tokenizer: Path, load: Load, out: Path) -> Figures:
    """`vllm bench serve` with the random dataset: 128 tokenizer tokens of text per prompt."""
    argv = [
        python, str(ENTRY), CLI_FLAG, "bench", "serve", "--backend", "openai-chat", "--base-url", base_url,
        "--endpoint", "/v1/chat/completions", "--model", model, "--tokenizer", str(tokenizer),
        "--dataset-name", "random", "--random-input-len", "128", "--random-output-len", str(load.output_tokens),
        "--ignore-eos", "--num-prompts", str(load.streams * load.requests_per_stream),
        "--max-concurrency", str(load.streams), "--request-rate", str(load.streams), "--seed", "1",
        "--percentile-metrics", "ttft,tpot", "--metric-percentiles", "50", "--disable-tqdm",
        "--save-result", "--result-dir", str(out), "--result-filename", "vllm-bench.json",
    ]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    result: dict[str, Any] = json.loads((out / "vllm-bench.json").read_text())
    num = load.streams * load.requests_per_stream
    assert result["completed"] == num and result["failed"] == 0, result
    assert result["total_output_tokens"] == num * load.output_tokens, result
    return Figures(
        result["output_throughput"],
        result["median_ttft_ms"],
        result["median_tpot_ms"],
        result["total_input_tokens"] / result["completed"],
    )


def template_tokens(base_url: str, model: str) -> int:
    """Prompt tokens a chat request adds to its message's own (the chat template): the
    harness sizes the message, vLLM's client reports usage."""
    text = "the quick brown fox jumps over the lazy dog"
    chat = _post(base_url + "/v1/chat/completions", {"model": model, "max_tokens": 1,
                                                     "messages": [{"role": "user", "content": text}]})  # fmt: skip
    alone = _post(base_url + "/tokenize", {"model": model, "prompt": text})
    return int(chat["usage"]["prompt_tokens"]) - int(alone["count"])


def _post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        answer: dict[str, Any] = json.load(response)
    return answer


def harness(base_url: str, model: str, prompt_tokens: int, load: Load, out: Path) -> Figures:
    """The real Locust run; prompt_tokens = the message's own tokens (calibrated with /tokenize)."""
    settings = write_settings(
        out / "settings.json", base_url, out / "runs", "agreement",
        load_test={"steps": [load.streams], "spawn_rate": load.streams, "warmup_seconds": 2,
                   "step_duration_seconds": load.step_s, "measure_last_seconds": load.step_s - 2},
        workload={"model": model, "input_tokens": prompt_tokens, "max_output_tokens": load.output_tokens,
                  "ignore_eos": True},
        metrics={"gpu_util": {"source": "none"}, "backend_metrics_urls": []},
    )  # fmt: skip
    result = run_locust(settings, timeout_s=load.step_s + 90)
    assert (out / "runs" / "agreement" / "report.json").exists(), result.stderr[-3000:]
    (step,) = read_report(out / "runs" / "agreement")["steps"]
    check_few_failed(result, step, load.failed_share_ok)
    assert step["token_count_source"] == "usage", step
    assert step["output_tokens_mean"] == load.output_tokens, step
    return Figures(step["output_tps"], step["ttft_ms"]["p50"], step["tpot_ms"]["p50"], step["input_tokens_mean"])


def run_both(python: str, base_url: str, model: str, tokenizer: Path, load: Load, out: Path) -> tuple[Figures, Figures]:
    """vLLM's client first (its prompts' usage sets the harness's prompt length), then the
    harness; both must have sent the same prompt length as the server counts it (within 2
    tokens: a real tokenizer merges the harness's nonce with its neighbour now and then)."""
    (out / "vllm").mkdir(parents=True)
    (out / "harness").mkdir()
    theirs = vllm_bench(python, base_url, model, tokenizer, load, out / "vllm")
    overhead = template_tokens(base_url, model)
    ours = harness(base_url, model, round(theirs.prompt_tokens_mean) - overhead, load, out / "harness")
    print(f"vllm bench serve: {theirs}\nharness:          {ours}")
    assert abs(ours.prompt_tokens_mean - theirs.prompt_tokens_mean) <= 2, (theirs, ours)
    return theirs, ours


def compare(python: str, base_url: str, model: str, tokenizer: Path, load: Load, out: Path) -> None:
    theirs, ours = run_both(python, base_url, model, tokenizer, load, out)
    for name in ("output_tps", "ttft_p50_ms", "tpot_p50_ms"):
        mine, other = getattr(ours, name), getattr(theirs, name)
        assert abs(mine - other) <= TOLERANCE * other, f"{name}: harness {mine}, vllm bench serve {other}"
