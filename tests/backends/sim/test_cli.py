"""`zerogap sim` and `zerogap sim plan` as a user runs them."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request

import pytest

from backends.sim import cli
from backends.sim.testing import free_port, run_sim_process, stop_process, wait_healthy


def _zerogap(*args: str, cwd=None) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "zerogap", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=cwd, check=False)


def test_plan_prints_a_row_per_step():
    result = _zerogap(
        "sim", "plan", "--config", "/dev/null", "--concurrency", "8,32", "--prompt-tokens", "64",
        "--output-tokens", "32", "--step-duration-s", "20", "--measure-last-s", "10",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert "virtual time" in lines[0]
    assert lines[1].split()[:4] == ["mode", "concurrency", "output_tps", "rps"]
    rows = [line.split() for line in lines[2:]]
    assert [row[1] for row in rows] == ["8", "32"]
    assert all(row[0] == "async+slot_reuse" for row in rows)  # the config defaults
    assert float(rows[0][2]) < float(rows[1][2])


def test_plan_compare_json_shows_the_three_fixes(capsys):
    argv = ["plan", "--config", "/dev/null", "--concurrency", "256", "--compare", "--json",
            "--step-duration-s", "20", "--measure-last-s", "10", "--output-tokens", "128"]  # fmt: skip
    assert cli.main(argv) == 0
    rows = {row["mode"]: row for row in json.loads(capsys.readouterr().out)}
    assert list(rows) == ["baseline", "slot_reuse", "async+slot_reuse"]
    busy = [rows[m]["gpu_busy"] for m in rows]
    assert busy == sorted(busy)
    assert rows["async+slot_reuse"]["output_tps"] / rows["baseline"]["output_tps"] >= 1.6


def test_plan_flags_override_the_config(tmp_path, capsys):
    config = tmp_path / "config.toml"
    config.write_text('[server]\napi_key = "${UNSET_FOR_SIM_TEST}"\n[token_interval]\nasync_scheduling = true\n'
                      "[sim]\ntime_scale = 2.0\n")  # fmt: skip
    argv = ["plan", "--config", str(config), "--concurrency", "4", "--json", "--step-duration-s", "5",
            "--measure-last-s", "2", "--scheduling", "sync", "--no-slot-reuse"]  # fmt: skip
    assert cli.main(argv) == 0
    [row] = json.loads(capsys.readouterr().out)
    assert row["mode"] == "baseline"
    baseline_4 = 2.0 * (5.0 + 4 * 0.117 + 3.0 + 4 * (0.043 + 0.082))  # ms at time_scale 2, all decoding
    assert row["tpot_mean_s"] * 1000 == pytest.approx(baseline_4, rel=0.1)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["plan", "--concurrency", "a,b"], "whole numbers"),
        (["plan", "--concurrency", "0"], ">= 1"),
        (["plan", "--concurrency", "4", "--time-scale", "-1"], "must be > 0"),
        (["plan", "--concurrency", "4", "--scheduling", "fast"], "invalid choice"),
        (["plan", "--concurrency", "4", "--measure-last-s", "500"], "must not exceed"),
        (["plan", "--concurrency", "4", "--prompt-tokens", "9000"], "exceeds max_model_len"),
        (["--port", "x"], "invalid int"),
    ],
)
def test_bad_flags_exit_2_with_a_message(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["--config", "/dev/null", *argv] if argv[0] != "plan" else [*argv, "--config", "/dev/null"])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_bad_config_is_reported_not_raised(tmp_path):
    config = tmp_path / "config.toml"
    config.write_text("[sim]\ntime_scale = -3\n")
    result = _zerogap("sim", "--config", str(config), "--port", str(free_port()))
    assert result.returncode == 2
    assert "[sim].time_scale" in result.stderr and "Traceback" not in result.stderr
    missing = _zerogap("sim", "plan", "--config", str(tmp_path / "nope.toml"), "--concurrency", "4")
    assert missing.returncode == 2 and "no such file" in missing.stderr


def test_max_model_len_larger_than_the_kv_cache_is_refused():
    result = _zerogap("sim", "--config", "/dev/null", "--kv-cache-blocks", "4", "--max-model-len", "1024")
    assert result.returncode == 2
    assert "exceeds the KV cache" in result.stderr


def test_serve_reads_config_and_flags_win(tmp_path):
    config = tmp_path / "config.toml"
    config.write_text(
        '[server]\napi_key = "${UNSET_FOR_SIM_TEST}"\n[engine]\nserved_model_name = "from-config"\n'
        "max_model_len = 1024\n[token_interval]\nasync_scheduling = false\n[sim]\ntime_scale = 5.0\n"
    )
    with run_sim_process("--time-scale", "2", config=config, model="from-flag") as sim:
        with urllib.request.urlopen(f"{sim.url}/sim/stats", timeout=5) as response:
            stats = json.loads(response.read())
        with urllib.request.urlopen(f"{sim.url}/v1/models", timeout=5) as response:
            card = json.loads(response.read())["data"][0]
    assert stats["time_scale"] == 2.0
    assert stats["mode"] == "slot_reuse"  # sync from the config, slot reuse by default
    assert card["id"] == "from-flag" and card["max_model_len"] == 1024


def test_port_in_use_is_a_clear_error():
    with run_sim_process() as sim:
        cmd = [sys.executable, "-m", "zerogap", "sim", "--config", "/dev/null", "--port", str(sim.port)]
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 1
    assert f"cannot listen on 127.0.0.1:{sim.port}" in result.stderr


def test_sigterm_stops_the_server_cleanly(tmp_path):
    port = free_port()
    log = tmp_path / "log"
    with log.open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "zerogap", "sim", "--config", "/dev/null", "--port", str(port)], stderr=err
        )
    try:
        wait_healthy(f"http://127.0.0.1:{port}", proc, log)
        proc.terminate()
        assert proc.wait(10) == 0
    finally:
        stop_process(proc)
    assert "Traceback" not in log.read_text()


def test_plan_prints_times_in_ms_and_compare_prints_ratio_lines(capsys):
    argv = ["plan", "--config", "/dev/null", "--concurrency", "32", "--compare", "--step-duration-s", "20",
            "--measure-last-s", "10", "--output-tokens", "64", "--prompt-tokens", "64"]  # fmt: skip
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "times in ms" in out and "ttft_p50_ms" in out and "tpot_p50_ms" in out and "_s " not in out
    ratios = [
        line for line in out.splitlines() if line.startswith(("slot_reuse/baseline", "async+slot_reuse/baseline"))
    ]
    assert len(ratios) == 2, out
    for line in ratios:
        assert "at 32 users: output TPS" in line and "GPU busy" in line and "TTFT p50" in line and "TPOT p50" in line
    async_tps = float(ratios[1].split("output TPS ")[1].split("x")[0])
    assert async_tps > 1.2  # async + slot reuse against the baseline


def test_capacity_answer_is_the_fewest_replicas_that_meet_the_slo(tmp_path, capsys):
    """An engine whose decode step is 10 ms + 1 ms per sequence (no prefill cost, no client gap,
    no slot reuse): TPOT p50 = 10 + n ms at n users per replica, so TPOT <= 40.5 ms holds up to 30
    users per replica, and 100 users need 4 replicas (3 would hold 33-34 each)."""
    config = tmp_path / "config.toml"
    config.write_text(
        "[token_interval]\nasync_scheduling = false\nslot_reuse = false\n\n[sim]\nforward_fixed_ms = 6.0\n"
        "interval_fixed_ms = 4.0\nforward_per_seq_ms = 0.5\ninterval_per_seq_ms = 0.25\n"
        "interval_schedule_per_seq_ms = 0.25\nforward_per_prefill_token_ms = 0.0\n"
    )
    argv = ["plan", "--config", str(config), "--users", "100", "--slo", "ttft_ms=100000,tpot_ms=40.5",
            "--prompt-tokens", "16", "--output-tokens", "32", "--step-duration-s", "12",
            "--measure-last-s", "8"]  # fmt: skip
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    print(out)
    rows = [line.split() for line in out.splitlines() if line.strip()[:1].isdigit()]
    assert [row[0] for row in rows] == ["1", "2", "3", "4"]
    assert [row[1] for row in rows] == ["100", "50", "33-34", "25"]
    assert all("missed:" in " ".join(row) for row in rows[:3]) and rows[3][-1] == "met"
    assert float(rows[3][4]) == pytest.approx(10 + 25, rel=0.02)  # TPOT p50 of 25 users a replica
    assert "answer: 4 replica(s) serve 100 users" in out


def test_capacity_needs_both_slos(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["plan", "--config", "/dev/null", "--users", "8", "--slo", "ttft_ms=100"])
    assert exc.value.code == 2
    assert "has no tpot_ms" in capsys.readouterr().err
