"""What one gateway process costs, next to nginx as a plain streaming proxy, in one run.

Four processes: the upstream (bench/_upstream.py, exact timing), the gateway (`zerogap
gateway`, one process), nginx (1 worker, `proxy_buffering off`, keep-alive upstream), and the
load generator (bench/_loadgen.py, its own process, never measured as part of a relay). Round
after round the load generator drives the upstream directly, through the gateway and through
nginx, in rotating order, and reads each process's CPU (/proc) within the measured window.

Two modes, both by default (`--mode fixed|saturate|both`):
  fixed     256 streams at the upstream's modest pace (50 ms to the first token, 10 tokens/s
            per stream, 32 tokens per request): the added TTFT p50 vs direct and vs nginx, and
            CPU µs per relayed token, one SSE event per read, as a GPU server streams.
  saturate  256 streams from a fast upstream (a token every 2 ms per stream, more than one
            process can relay): the most tokens/s each relay passes on, and its CPU µs per token.

Every figure is printed as the median over the rounds with its [min..max]. A relay whose
CPU is near a full core is at its limit; the load generator's CPU is printed too, and the
bench says so when it was the one at its limit (then the figure is a floor, not a limit).

    .venv/bin/python -m bench.gateway_overhead [--mode both] [--rounds 5] [--concurrency 256]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from backends.process_group import stop_process
from bench._report import report
from zerogap.net import free_port, wait_for_port

REPO = Path(__file__).resolve().parent.parent
KEY = "bench-unified-key"
NGINX_INSTALL = "apt-get install -y nginx-light (or scripts/setup-system)"

MODES = {  # upstream timing, tokens per request, warm-up and measured seconds per round
    "fixed": {"ttft_s": 0.05, "interval_s": 0.1, "num_tokens": 32, "warmup_s": 4.0, "round_s": 8.0},
    "saturate": {"ttft_s": 0.0, "interval_s": 0.002, "num_tokens": 512, "warmup_s": 2.0, "round_s": 5.0},
}

NGINX_CONF = """worker_processes 1;
daemon off;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log warn;
events {{ worker_connections 8192; }}
http {{
    access_log off;
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    upstream up {{ server 127.0.0.1:{up_port}; keepalive 1024; }}
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        location / {{
            proxy_pass http://up;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_request_buffering off;
        }}
    }}
}}
"""


def start(cmd: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL)


def gateway_config(tmp: Path, port: int, up_port: int) -> Path:
    config = tmp / "config.toml"
    config.write_text(
        f'[server]\nport = {port}\napi_key = "${{TAOTOKEN_API_KEY}}"\n'
        f'base_url = "http://127.0.0.1:{port}/api"\n[gateway]\nkey_store = "keys.db"\n'
        f'[logging]\nlevel = "warning"\n'
        f'[[backends]]\nname = "up"\nurl = "http://127.0.0.1:{up_port}"\nmodel = "bench"\n'
    )
    return config


def nginx_pids(master: subprocess.Popen[bytes]) -> list[int]:
    import psutil

    return [master.pid, *(c.pid for c in psutil.Process(master.pid).children())]


def run_mode(mode: str, args: argparse.Namespace, env: dict[str, str], nginx: str | None) -> dict[str, Any]:
    m = {**MODES[mode], **({"round_s": args.round_s} if args.round_s else {})}
    up_port, gw_port, ng_port = free_port(), free_port(), free_port()
    procs: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory(prefix="zerogap-bench-") as tmp_name:
        tmp = Path(tmp_name)
        try:
            upstream = start([sys.executable, "-m", "bench._upstream", "--port", str(up_port),
                              "--ttft-s", str(m["ttft_s"]), "--interval-s", str(m["interval_s"]),
                              "--num-tokens", str(m["num_tokens"])], env)  # fmt: skip
            procs.append(upstream)
            config = gateway_config(tmp, gw_port, up_port)
            gateway = start([sys.executable, "-m", "zerogap", "gateway", "--config", str(config)], env)
            procs.append(gateway)
            targets = [f"direct=http://127.0.0.1:{up_port}", f"gateway=http://127.0.0.1:{gw_port}"]
            watch = [f"upstream={upstream.pid}", f"gateway={gateway.pid}"]
            if nginx:
                (tmp / "nginx.conf").write_text(NGINX_CONF.format(tmp=tmp, up_port=up_port, port=ng_port))
                ng = start([nginx, "-p", str(tmp), "-c", str(tmp / "nginx.conf"), "-e", str(tmp / "error.log")], env)
                procs.append(ng)
                wait_for_port(ng_port, 30, ng)
                targets.append(f"nginx=http://127.0.0.1:{ng_port}")
                watch.append("nginx=" + ",".join(str(p) for p in nginx_pids(ng)))
            wait_for_port(up_port, 30, upstream)
            wait_for_port(gw_port, 30, gateway)
            out = tmp / "rounds.json"
            spread_s = m["ttft_s"] + m["num_tokens"] * m["interval_s"]
            cmd = [sys.executable, "-m", "bench._loadgen", "--rounds", str(args.rounds),
                   "--concurrency", str(args.concurrency), "--warmup-s", str(m["warmup_s"]),
                   "--round-s", str(m["round_s"]), "--spread-s", str(spread_s), "--max-tokens", str(m["num_tokens"]),
                   "--key", KEY, "--out", str(out)]  # fmt: skip
            for t in targets:
                cmd += ["--target", t]
            for w in watch:
                cmd += ["--watch", w]
            subprocess.run(cmd, cwd=REPO, env=env, check=True)
            rounds: list[dict[str, Any]] = json.loads(out.read_text())
        finally:
            for proc in reversed(procs):
                stop_process(proc)
    return {"mode": mode, "timing": m, "rounds": rounds}


def find_nginx(args: argparse.Namespace) -> str | None:
    if args.no_nginx:
        return None
    found = shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if os.path.exists(p)), None)
    if found is None:
        raise SystemExit(f"nginx is not installed: {NGINX_INSTALL}; or pass --no-nginx")
    return found


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=["fixed", "saturate", "both"], default="both")
    p.add_argument("--concurrency", type=int, default=256)
    p.add_argument("--rounds", type=int, default=5, help="rounds per mode; each drives every target once")
    p.add_argument("--round-s", type=float, help="measured seconds per round (default: the mode's)")
    p.add_argument("--no-nginx", action="store_true", help="leave nginx out (no side-by-side proxy figure)")
    p.add_argument("--json", help="also write every round and the summary to this file")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    nginx = find_nginx(args)
    env = {**os.environ, "PYTHONPATH": str(REPO), "TAOTOKEN_API_KEY": KEY}
    results = []
    for mode in ("fixed", "saturate") if args.mode == "both" else (args.mode,):
        m = {**MODES[mode], **({"round_s": args.round_s} if args.round_s else {})}
        print(
            f"{mode}: {args.concurrency} streams, upstream TTFT {1000 * m['ttft_s']:.0f} ms, a token every "
            f"{1000 * m['interval_s']:g} ms per stream, {m['num_tokens']} tokens per request; {args.rounds} rounds "
            f"of {m['warmup_s']:g}+{m['round_s']:g} s per target; {os.cpu_count()} cores, load average {load()}",
            file=sys.stderr,
            flush=True,
        )
        result = run_mode(mode, args, env, nginx)
        result["summary"] = report(result["rounds"], mode, load())
        results.append(result)
    if args.json:
        Path(args.json).write_text(json.dumps(results))
    return 0


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


if __name__ == "__main__":
    raise SystemExit(main())
