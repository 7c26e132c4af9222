"""The other relays bench/gateway_overhead.py sets beside the gateway: nginx (a plain streaming
proxy) and the two LLM routers written in Rust that users put in front of vLLM.

The routers are pip wheels, installed on first use into the bench's own environment
(PEERS_VENV, pinned versions), never into the product's: `vllm-router` and `sglang-router`
each run as one process (their launcher execs the Rust router in place; its threads are in
that process), routing round_robin to the one upstream, with retries, the circuit breaker and
health checks left at their defaults and Prometheus on a port of its own.

    python -m bench._peers            # install the routers (once) and say where they are
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
from dataclasses import dataclass
from pathlib import Path

PEERS_VENV = Path(os.environ.get("ZEROGAP_BENCH_PEERS", Path.home() / ".cache" / "zerogap" / "bench-peers"))
NGINX_INSTALL = "apt-get install -y nginx-light (or scripts/setup-system)"
REDIS_INSTALL = "apt-get install -y redis-server (or scripts/setup-system)"

NGINX_CONF = """worker_processes {num_workers};
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
        listen 127.0.0.1:{port} backlog=4096{reuseport};
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


@dataclass(frozen=True)
class Router:
    """A router from PyPI: its pinned requirement and how it is started."""

    name: str
    requirement: str
    script: str
    subcommand: tuple[str, ...]
    log_level: str

    def executable(self) -> Path:
        return PEERS_VENV / "bin" / self.script

    def command(self, port: int, up_port: int, metrics_port: int) -> list[str]:
        return [
            str(self.executable()),
            *self.subcommand,
            "--host", "127.0.0.1",
            "--port", str(port),
            "--worker-urls", f"http://127.0.0.1:{up_port}",
            "--policy", "round_robin",
            "--prometheus-host", "127.0.0.1",
            "--prometheus-port", str(metrics_port),
            "--log-level", self.log_level,
        ]  # fmt: skip


ROUTERS = {
    r.name: r
    for r in (
        Router("vllm-router", "vllm-router==0.1.17", "vllm-router", (), "warning"),
        Router("sglang-router", "sglang-router==0.3.2", "sglang-router", ("launch",), "warn"),
    )
}
PEERS = ("nginx", *ROUTERS)


def find_nginx() -> str | None:
    return shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if os.path.exists(p)), None)


def nginx_command(nginx: str, tmp: Path, port: int, up_port: int, num_workers: int = 1) -> list[str]:
    """nginx as a streaming proxy to the upstream; with more than one worker, each has its own
    listening socket (reuseport), so that the kernel spreads the connections over them."""
    tmp.mkdir()
    reuseport = " reuseport" if num_workers > 1 else ""
    conf = NGINX_CONF.format(tmp=tmp, up_port=up_port, port=port, num_workers=num_workers, reuseport=reuseport)
    (tmp / "nginx.conf").write_text(conf)
    return [nginx, "-p", str(tmp), "-c", str(tmp / "nginx.conf"), "-e", str(tmp / "error.log")]


def find_redis() -> str | None:
    return shutil.which("redis-server") or next((p for p in ("/usr/bin/redis-server",) if os.path.exists(p)), None)


def redis_command(redis: str, tmp: Path, port: int) -> list[str]:
    """A throwaway redis-server for the tenant-redis target's limits: loopback only, nothing saved."""
    tmp.mkdir()
    return [redis, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
            "--dir", str(tmp), "--loglevel", "warning", "--daemonize", "no"]  # fmt: skip


def install_routers(names: list[str]) -> list[str]:
    """The routers of `names` that are ready, installing the missing ones into PEERS_VENV first;
    one that cannot be installed (offline, no wheel for this platform) is named on stderr and left out."""
    missing = [ROUTERS[n] for n in names if not ROUTERS[n].executable().exists()]
    if missing:
        if not (PEERS_VENV / "bin" / "python").exists():
            venv.create(PEERS_VENV, with_pip=True)
        cmd = [str(PEERS_VENV / "bin" / "python"), "-m", "pip", "install", "-q", *(r.requirement for r in missing)]
        print(f"installing {', '.join(r.requirement for r in missing)} into {PEERS_VENV}", file=sys.stderr)
        if subprocess.run(cmd, check=False).returncode != 0:
            print("  the install failed: those routers are left out of this run", file=sys.stderr)
    ready = [n for n in names if ROUTERS[n].executable().exists()]
    return ready


def main() -> int:
    ready = install_routers(list(ROUTERS))
    for name in ROUTERS:
        print(f"{name}: {ROUTERS[name].executable() if name in ready else 'not installed'}")
    print(f"nginx: {find_nginx() or 'not installed: ' + NGINX_INSTALL}")
    print(f"redis-server (for --peers tenant-redis): {find_redis() or 'not installed: ' + REDIS_INSTALL}")
    return 0 if len(ready) == len(ROUTERS) else 1


if __name__ == "__main__":
    raise SystemExit(main())
