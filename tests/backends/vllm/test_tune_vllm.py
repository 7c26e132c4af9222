"""`zerogap tune --engine vllm` with real vLLM (a small local model): two candidates,
each a real replica started, load-tested through the real Locust harness, and stopped;
the one capped at 2 sequences under 16 users is diagnosed batch_cap.

The premise, on 2 shared cores: the engine, not its API server, is the bottleneck. With the
tiny model (an engine step well under a millisecond) it was not: vLLM's API server and the
load generator held the requests while the engine sat nearly idle (running 0.8, waiting 0.4 of
8 users: the frontend limit, see test_frontend_vllm.py), and even with `--stream-interval 16`
a clean-clone run read running 1, waiting 0 of 16 users. So this test serves the HEAVY shape
(~100M parameters, backends/tiny_model/weights.py): a step costs ~25 ms on a CPU, a 64-token
answer ~1.6 s at the cap, and the API server's work per request is small beside it. Measured:
running 2.0 and waiting 14.0 in every sample of the capped run (TTFT climbing to 12 s), 68
output tok/s capped vs 276 at max_num_seqs=16 (running 13.7, waiting 0). `--enforce-eager`:
vLLM's torch.compile warm-up was ~45 s of each candidate's start (its cache is keyed by the
model's path, new in every run); eager, the test took 118 s instead of 190 s."""

from __future__ import annotations

import csv
import json
import re
import subprocess
from pathlib import Path

import pytest

from backends.tiny_model import HEAVY
from loadtest import diagnose
from tests.backends.vllm.models import cached_tiny_model
from tests.backends.vllm.pool import MODEL, READY_TIMEOUT_S, vllm_interpreter
from tests.support import REPO, zerogap_cmd

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(900)]


def test_tune_two_vllm_candidates(tmp_path: Path, nothing_beside: None) -> None:
    """A timed comparison: nothing else starts or runs beside it (nothing_beside). When the tier's
    shared replica started beside it, the 16-sequence candidate delivered 0 tokens in its window
    on two fresh clones, and the capped one won."""
    model = cached_tiny_model(HEAVY)
    config = tmp_path / "config.toml"
    config.write_text(
        f"""[engine]
model = "{model}"
served_model_name = "{MODEL}"
python = "{vllm_interpreter()}"
max_model_len = 512
extra_args = ["--stream-interval", "4", "--enforce-eager"]
startup_timeout_s = {READY_TIMEOUT_S}
stop_timeout_s = 20
env = {{ VLLM_CPU_KVCACHE_SPACE = "1" }}
"""
    )
    out = tmp_path / "tune"
    cmd = zerogap_cmd("tune", "--config", str(config), "--engine", "vllm", "--grid", "max_num_seqs=2,16")
    # A 10 s window: with the heavy model the harness's sampler reads vLLM every second (with the
    # tiny model vLLM's API server starved it to one scrape per ~4 s, and it needed 20 s).
    cmd += ["--steps", "16", "--step-seconds", "13", "--measure-seconds", "10", "--warmup-seconds", "5"]
    # 32-token answers streamed every 4 steps: beside two busy loops a step at 16 sequences took over
    # a second, and 64-token answers streamed every 16 steps sent their first chunk after the window
    # had closed (0 tokens measured for the 16-sequence candidate).
    cmd += ["--input-tokens", "32", "--output-tokens", "32", "--out", str(out)]
    run = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=800, check=False)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    data = json.loads((out / "tune.json").read_text())
    candidates = data["candidates"]
    keys = [(c["goodput_rps"], c["output_tps"]) for c in candidates]
    assert keys == sorted(keys, reverse=True) and data["best"]["settings"] == candidates[0]["settings"]
    assert sorted(c["settings"]["scheduler.max_num_seqs"] for c in candidates) == [2, 16]
    (capped,) = [c for c in candidates if c["settings"]["scheduler.max_num_seqs"] == 2]
    (wide,) = [c for c in candidates if c["settings"]["scheduler.max_num_seqs"] == 16]
    # Both ran and streamed tokens (events: each run's requests.csv, not the tokens that fell in a 10 s
    # window, which on a slow machine state held none of the capped run's: CI, 2026-12-07; and not whole
    # answers: tune cuts the streams at the run's end, and at 0.6 s a step no 32-token answer of the
    # 16-sequence run ended within its 18 s, 2026-12-07); tune ranked them by
    # what it measured (the sort above). Which one wins is this machine's fact, not tune's: 16 sequences
    # beat 2 by 4x on 2026-12-04 and lost on 2026-12-07 (0.6 s a step at 16 sequences, 44-87 ms at 2).
    for candidate in (capped, wide):
        assert _served(Path(candidate["run_dir"])), json.dumps(candidates, indent=1)
    assert data["best"]["settings"] == max(candidates, key=lambda c: (c["goodput_rps"], c["output_tps"]))["settings"]
    assert "[2/2] max_num_seqs=16" in run.stdout and "best: max_num_seqs=" in run.stdout
    # The launcher's "in force" table: the candidate's setting reached vLLM.
    assert re.search(r"\[scheduler\]\.max_num_seqs\s+2\s", (out / "candidate1" / "pool" / "supervisor.log").read_text())
    (step,) = json.loads((Path(capped["run_dir"]) / "report.json").read_text())["steps"]
    engine = step["backend"]  # the harness's reading of vLLM's /metrics in the measured window
    print(f"capped at 2: {engine}; {capped['limit']}: {capped['evidence']}")
    assert engine["running_max"] <= 2, engine  # the cap was in force
    assert engine["waiting_mean"] >= 1.0, engine  # the premise: the engine, not its API server, holds the queue
    if capped["limit"] == "errors":  # vLLM on 2 busy cores drops a few connections (2 of 52 under 2 busy loops)
        assert "requests failed" in capped["evidence"], capped["evidence"]
        # The errors rule comes first; the engine's figures beneath it must still name the cap.
        step = {**step, "requests_failed": 0, "errors": {}, "backend": {**engine, "max_num_seqs": 2}}
        (capped,) = diagnose([step])
    assert capped["limit"] == "batch_cap", (capped["evidence"], engine)
    assert "of a cap of 2, waiting" in capped["evidence"]  # the cap tune started vLLM with


def _served(run_dir: Path) -> int:
    """How many of a run's requests got tokens (its requests.csv): answered, or cut at the run's end
    (interrupted) after their first tokens; a failed request counts for nothing."""
    with (run_dir / "requests.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    return sum(1 for r in rows if (r["ok"] == "1" or r["error"] == "interrupted") and int(r["output_tokens"] or 0) > 0)
