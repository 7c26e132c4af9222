"""`zerogap sim calibrate` on real vLLM (the CPU build, the tiny model): two real stepped
harness runs against the replica (fit at 1, 4, 16 users; check at 8 and 32), the fit, and
`zerogap sim plan --config FILE` at the held-out loads. The measured errors are printed.

Bound: the target is 20%; the test holds output TPS to a factor of 10 and only prints the
TTFT and TPOT errors. What the bound still catches: a fit that does not run on vLLM's figures,
a unit or scale slip (ms for s, per token for per request: factors of 30 to 1000), a fit that
fails (it once raised OverflowError on these runs).
On 2 shared cores the tiny model's engine step is well under a millisecond and vLLM's API
server and the load generator, not the engine, hold most of the time: the engine holds a
fraction of the users' requests (running 0.3 of 1 user, 0.7 of 4, measured), a request's 32
tokens often reach the client in one burst (TPOT p50 0 ms at 1-8 users), TTFT is the API
server's queue (80-200 ms against a ~1 ms step), and how much CPU each of them gets changes with
the load. Calibrate models the requests the load generator had in flight but the engine did
not hold as an API server (backends/sim/engine/frontend.py: one first-come-first-served server,
saturated at the busiest fit step), and the users not in flight as client_gap_ms. Before the API
server, measured output TPS errors at 8 and 32 users: +11% and -46%; -16% and -11%; on the CI
machine +88% and +144%, then +161% and +354%, and once 17.9x at 32 users: vLLM made 2,936 tok/s
at 16 users in the fit run and 683 and 688 at 8 and 32 in the held-out one (its API server,
with the engine's gauge at 0); the model without an API server did not cap. A ~100M-parameter model
(backends/tiny_model HEAVY), whose engine is the bottleneck, did not fit better (-27% and
+68%): vLLM's running gauge read 0.6 of 1 user, so calibrate took a second of every request
for a client gap. The test takes ~60 s here beside the tier's shared replica (whose start is
another ~60 s)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.backends.vllm.pool import MODEL, Pool
from tests.loadtest.helpers import run_locust, write_settings
from tests.support import REPO, zerogap_cmd

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(900)]

OUTPUT_TOKENS = 32
PROMPT_TOKENS = 64
TPS_FACTOR = 10.0  # the bound on the output TPS ratio (either way); the target is 1.2


@pytest.fixture
def pool(vllm_pool: Pool) -> Pool:
    return vllm_pool  # the tier's one replica (tests/conftest.py)


def _run(pool: Pool, out: Path, name: str, steps: list[int]) -> Path:
    settings = write_settings(
        out / f"{name}.json", pool.engine_url, out, name,
        load_test={"steps": steps, "warmup_seconds": 2, "step_duration_seconds": 8, "measure_last_seconds": 6},
        workload={"model": MODEL, "input_tokens": PROMPT_TOKENS, "max_output_tokens": OUTPUT_TOKENS,
                  "tokenize_url": pool.engine_url + "/tokenize"},
        metrics={"sample_interval_ms": 500, "gpu_util": {"source": "none"},
                 "backend_metrics_urls": [pool.engine_url + "/metrics"]},
    )  # fmt: skip
    result = run_locust(settings, timeout_s=240)
    assert (out / name / "report.json").exists(), result.stderr[-3000:]
    ran = json.loads((out / name / "report.json").read_text())["steps"]
    num_ok, num_failed = sum(s["requests_ok"] for s in ran), sum(s["requests_failed"] for s in ran)
    # The harness exits 1 when a request failed; vLLM on 2 busy cores fails one now and then (a
    # dropped connection; once an empty stream): a few are figures of the run, not of the fit.
    assert result.returncode == 0 or num_failed <= 0.05 * (num_ok + num_failed), (num_failed, result.stderr[-3000:])
    return out / name


def test_calibrate_on_real_vllm_predicts_held_out_loads(pool: Pool, tmp_path: Path) -> None:
    fit = _run(pool, tmp_path, "fit", [1, 4, 16])
    held = _run(pool, tmp_path, "held", [8, 32])
    # vLLM's CPU backend forces async scheduling off, whatever the pool's config asks for.
    config = tmp_path / "config.toml"
    config.write_text(pool.config.read_text().replace("async_scheduling = true", "async_scheduling = false"))
    out = tmp_path / "fitted.toml"
    cmd = zerogap_cmd("sim", "calibrate", str(fit), "--config", str(config), "--out", str(out))
    calibrated = subprocess.run(
        cmd, cwd=REPO, capture_output=True, text=True, timeout=300, check=False, env=dict(os.environ)
    )
    print(calibrated.stdout)
    assert calibrated.returncode == 0, calibrated.stdout[-3000:] + calibrated.stderr[-3000:]
    assert "no GPU-busy signal" in calibrated.stdout  # vLLM on a CPU: forward and interval cannot be split

    held_steps = json.loads((held / "report.json").read_text())["steps"]
    fit_steps = json.loads((fit / "report.json").read_text())["steps"]
    outside = [s for s in fit_steps if (s["backend"]["running_mean"] or 0) + (s["backend"]["waiting_mean"] or 0)
               < 0.9 * s["concurrency"]]  # fmt: skip
    if outside:  # the engine held fewer requests than there were users: said, and modelled (API server, gap)
        assert "the engine held fewer requests than" in calibrated.stdout
    prompt = round(held_steps[0]["input_tokens_mean"])  # as vLLM counts it (the chat template adds tokens)
    cmd = [sys.executable, "-m", "zerogap", "sim", "plan", "--config", str(out), "--concurrency", "8,32",
           "--prompt-tokens", str(prompt), "--output-tokens", str(OUTPUT_TOKENS),
           "--step-duration-s", "8", "--measure-last-s", "6", "--json"]  # fmt: skip
    planned = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
    assert planned.returncode == 0, planned.stderr[-3000:]
    predicted = {row["concurrency"]: row for row in json.loads(planned.stdout)}
    ratios = []
    for step in held_steps:
        row = predicted[step["concurrency"]]
        ratio = row["output_tps"] / step["output_tps"]
        ratios.append((step["concurrency"], ratio))
        tpot, ttft = _error(row["tpot_p50_s"], step["tpot_ms"]), _error(row["ttft_p50_s"], step["ttft_ms"])
        print(
            f"real vLLM, held out {step['concurrency']:g} users: output TPS {ratio - 1:+.1%}, "
            f"TPOT p50 {tpot}, TTFT p50 {ttft} (target 20%)"
        )
    for users, ratio in ratios:
        assert 1 / TPS_FACTOR <= ratio <= TPS_FACTOR, (users, ratio)


def _error(model_s: float | None, measured: dict[str, float] | None) -> str:
    p50 = (measured or {}).get("p50")
    if model_s is None or not p50:
        return "- (not measured: the tokens came in one burst)" if p50 == 0 else "-"
    return f"{1000 * model_s / p50 - 1:+.1%}"
