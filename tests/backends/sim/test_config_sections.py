"""A served sim takes its engine settings from config.toml's sections, as vLLM would: each
section's setting reaches the engine that `zerogap sim --config` serves (its startup line names
the mode it runs) and the load plan that `zerogap sim plan --config` models."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.support import zerogap_cmd

MODES = {
    (False, False): "baseline",
    (False, True): "slot_reuse",
    (True, False): "async",
    (True, True): "async+slot_reuse",
}


def _config(tmp_path: Path, async_scheduling: bool, slot_reuse: bool) -> Path:
    path = tmp_path / "config.toml"
    text = "true" if async_scheduling else "false"
    path.write_text(
        "[scheduler]\nmax_num_seqs = 64\n\n"
        f"[token_interval]\nasync_scheduling = {text}\n"
        f"slot_reuse = {'true' if slot_reuse else 'false'}\n"
    )
    return path


def _startup_line(config: Path, port: int) -> str:
    proc = subprocess.Popen(
        zerogap_cmd("sim", "--config", str(config), "--port", str(port)),
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stderr is not None
        for line in proc.stderr:  # ends when the process does: no wait on the clock
            if "serving" in line or "cannot" in line:
                return line
        return ""
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


@pytest.mark.parametrize(("async_scheduling", "slot_reuse"), list(MODES))
def test_the_served_engine_runs_the_mode_config_toml_names(
    tmp_path: Path, port: int, async_scheduling: bool, slot_reuse: bool
) -> None:
    line = _startup_line(_config(tmp_path, async_scheduling, slot_reuse), port)
    assert f"(mode {MODES[(async_scheduling, slot_reuse)]}," in line, line


def _plan(config: Path) -> list[dict[str, object]]:
    out = subprocess.run(
        zerogap_cmd("sim", "plan", "--config", str(config), "--concurrency", "64", "--json",
                    "--step-duration-s", "20", "--measure-last-s", "10"),
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    rows: list[dict[str, object]] = json.loads(out.stdout)
    return rows


def test_slot_reuse_off_in_config_toml_costs_the_plan_a_longer_interval(tmp_path: Path) -> None:
    """Without slot reuse every running request is rescheduled each step: the plan's steps slow down."""
    reuse = _plan(_config(tmp_path, async_scheduling=False, slot_reuse=True))
    (tmp_path / "off").mkdir()
    no_reuse = _plan(_config(tmp_path / "off", async_scheduling=False, slot_reuse=False))
    assert [row["mode"] for row in reuse] == ["slot_reuse"]
    assert [row["mode"] for row in no_reuse] == ["baseline"]
    assert float(no_reuse[0]["output_tps"]) < float(reuse[0]["output_tps"])  # type: ignore[arg-type]
