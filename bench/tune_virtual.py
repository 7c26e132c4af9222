"""`zerogap tune` in real time vs the same grid in virtual time (`--virtual`), side by side.

    .venv/bin/python bench/tune_virtual.py [--steps 32,128] [--step-seconds 10] [--time-scale 4]

The grid max_num_seqs=16,128 x async_scheduling=false,true (4 candidates) on sims: the
real-time tune starts a sim per candidate and load-tests it through the Locust harness
for every step; the virtual one runs the same scheduler and cost model without a clock.
Prints each one's wall time, the ratio, whether the two rank the candidates alike, and each
run's wall time against the estimate tune printed before it began ("about N s in all").
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import tempfile
import time
from pathlib import Path

from common.commands import zerogap_command

GRID = ["--grid", "max_num_seqs=16,128", "--grid", "async_scheduling=false,true"]


def _tune(folder: Path, common: list[str], *extra: str) -> tuple[float, list[str], float]:
    out = folder / ("virtual" if extra else "real")
    cmd = zerogap_command("tune", *common, *extra, "--out", str(out))
    started = time.monotonic()
    result = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=3600)
    elapsed = time.monotonic() - started
    if result.returncode != 0:
        raise SystemExit(f"zerogap tune failed ({result.returncode}):\n{result.stdout[-3000:]}{result.stderr[-3000:]}")
    ranking = [c["label"] for c in json.loads((out / "tune.json").read_text())["candidates"]]
    said = re.search(r"about (\d+) s in all", result.stdout)
    return elapsed, ranking, float(said.group(1)) if said else float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--steps", default="32,128")
    parser.add_argument("--step-seconds", default="10")
    parser.add_argument("--time-scale", default="4", help="the real-time sims' time scale (2 cores keep up at 4)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="zerogap-bench-tune-") as tmp:
        folder = Path(tmp)
        config = folder / "config.toml"
        config.write_text(f"[sim]\ntime_scale = {args.time_scale}\n")
        common = ["--config", str(config), "--engine", "sim", *GRID, "--steps", args.steps]
        common += ["--step-seconds", args.step_seconds, "--input-tokens", "64", "--output-tokens", "16"]
        real_s, real_rank, real_estimate_s = _tune(folder, common)
        virtual_s, virtual_rank, virtual_estimate_s = _tune(folder, common, "--virtual")
    print(f"grid: 4 candidates, steps {args.steps}, {args.step_seconds} s each (sim time scale {args.time_scale})")
    print(f"{'':>10} {'wall s':>8}  ranking")
    print(f"{'real time':>10} {real_s:>8.1f}  {' > '.join(real_rank)}")
    print(f"{'virtual':>10} {virtual_s:>8.1f}  {' > '.join(virtual_rank)}")
    agree = "agree" if real_rank == virtual_rank else "DIFFER"
    print(f"real / virtual wall time: {real_s / virtual_s:.1f}x; rankings {agree}")
    print(f"took / estimated: real time {real_s / real_estimate_s:.2f}x, virtual {virtual_s / virtual_estimate_s:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
