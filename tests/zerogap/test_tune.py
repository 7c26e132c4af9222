"""`zerogap tune`: the grid's checks, and the ranking of max_num_seqs x async_scheduling
on sims, in virtual time and in real time (real sims, the real Locust harness)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.support import zerogap_cmd
from zerogap.tune.cli import main as tune_main

GRID = ["--grid", "max_num_seqs=16,128", "--grid", "async_scheduling=false,true"]
BEST = {"scheduler.max_num_seqs": 128, "token_interval.async_scheduling": True}
# One step of 64 users: 16 slots queue 48 of them; short outputs put enough requests in a 3 s window.
SHORT = ["--steps", "64", "--input-tokens", "64", "--output-tokens", "16", "--slo", "ttft_ms=5000,tpot_ms=500"]


def ranking(out: Path) -> list[dict[str, object]]:
    data = json.loads((out / "tune.json").read_text())
    return [c["settings"] for c in data["candidates"]]


@pytest.mark.parametrize(
    ("grid", "message"),
    [
        ("max_num_seqs=0,16", "[scheduler].max_num_seqs: Input should be greater than or equal to 1 (got 0)"),
        ("async_scheduling=maybe", "[token_interval].async_scheduling: Input should be a valid boolean"),
        ("max_num_seq=16", "--grid max_num_seq: no such field in [scheduler], [token_interval], [engine], [sim]"),
        ("max_num_seq=16", "Did you mean `max_num_seqs`? (--grid max_num_seqs=...)"),
        ("scheduler.max_num_seq=16", "Did you mean `scheduler.max_num_seqs`? (--grid scheduler.max_num_seqs=...)"),
        ("asynch_scheduling=true", "Did you mean `async_scheduling`?"),
        ("zzz=1", "--grid zzz: no such field in [scheduler], [token_interval], [engine], [sim]. Check its spelling."),
        ("server.port=1", "--grid server.port: [server] cannot be tuned"),
        ("max_num_seqs", "write NAME=V1,V2"),
    ],
)
def test_bad_grid_gets_the_configs_message_before_anything_starts(
    grid: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = tune_main(["--engine", "sim", "--grid", grid, "--out", str(tmp_path / "t")])
    err = capsys.readouterr().err
    assert code == 2 and message in err, err
    assert not (tmp_path / "t").exists()


def test_virtual_needs_the_sim(capsys: pytest.CaptureFixture[str]) -> None:
    assert tune_main(["--engine", "vllm", "--virtual", *GRID]) == 2
    assert "--virtual runs the simulated engine's model: add --engine sim" in capsys.readouterr().err


def test_virtual_tune_picks_128_and_async(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "virtual"
    code = tune_main(["--engine", "sim", "--virtual", *GRID, *SHORT, "--step-seconds", "8", "--out", str(out)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert ranking(out)[0] == BEST
    data = json.loads((out / "tune.json").read_text())
    assert data["best"]["settings"] == BEST
    assert "[scheduler]\nmax_num_seqs = 128\n" in (out / "best.toml").read_text()
    first = data["candidates"][0]
    for key in ("settings", "goodput_rps", "output_tps", "ttft_ms", "tpot_ms", "gpu_util", "limit"):
        assert key in first
    assert {c["limit"] for c in data["candidates"] if c["settings"]["scheduler.max_num_seqs"] == 16} == {"batch_cap"}
    assert "about" in printed and "[4/4]" in printed and "batch_cap" in printed
    # each candidate's line prints its figures as the table does (1,234 tok/s, not 1234.56 tok/s)
    lines = [line for line in printed.splitlines() if ": goodput " in line]
    assert len(lines) == 4, printed
    for line in lines:
        tps = re.search(r"output (\S+) tok/s", line)
        assert tps is not None and re.fullmatch(r"\d{1,3}(,\d{3})*", tps.group(1)), line
    assert (out / "report.html").read_text().count("<tr>") == 5 and (out / "tune.png").is_file()


@pytest.mark.slow
def test_real_time_tune_on_sims_agrees_with_virtual_time(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text("[sim]\ntime_scale = 4\n")  # 2 busy cores keep up with a 4x slower engine
    common = ["--config", str(config), "--engine", "sim", *GRID, *SHORT, "--step-seconds", "4"]
    real, virtual = tmp_path / "real", tmp_path / "virtual"
    run = subprocess.run(
        zerogap_cmd("tune", *common, "--warmup-seconds", "1", "--out", str(real)),
        capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert tune_main([*common, "--virtual", "--out", str(virtual)]) == 0
    assert ranking(real) == ranking(virtual)
    assert ranking(real)[0] == BEST
    data = json.loads((real / "tune.json").read_text())
    assert all(Path(c["run_dir"], "report.json").is_file() for c in data["candidates"])
    assert "zerogap step 1/1 64 users" in run.stdout
