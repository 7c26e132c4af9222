"""What one gateway process costs, next to nginx and the Rust LLM routers, in one run.

The processes: the upstream (bench/_upstream.py, exact timing), the gateway (`zerogap gateway`,
one process), the peers (bench/_peers.py: nginx, 1 worker, `proxy_buffering off`, keep-alive
upstream; vllm-router 0.1.17 and sglang-router 0.3.2, round_robin to the one upstream, installed
on first use into the bench's own environment, never the product's), and the load generator
(bench/_loadgen.py, its own process, never measured as part of a relay). Round after round the
load generator drives the upstream directly, through the gateway and through each peer, in
rotating order, and reads the CPU of each process tree (/proc) within the measured window.

Two modes, both by default (`--mode fixed|saturate|both`), and two for the cost of a request (issue 36):
  fixed     `--concurrency` streams (256) at a GPU server's pace (issue 23's upstream: 50 ms to
            the first token, a token every 50 ms per stream, 64 ± 32 tokens per request): the
            TPS ratio and the added TTFT p50 and p99 of each relay vs direct, and its CPU µs
            per relayed token, one SSE event per read, as a GPU server streams.
  saturate  256 streams from a fast upstream (a token every 2 ms per stream, 64 per request,
            more than one process can relay): the most tokens/s each relay passes on, and its
            CPU µs per token (lower than in `fixed`: at its limit a read brings several chunks).
  workers   (not in `both`) as saturate, one gateway process vs `--workers 2`, no peers:
            the tokens/s ratio (it needs 2 free cores beside the upstream and the load
            generator). `--peers workers2` puts `--workers 2` beside one process in `fixed`
            instead: CPU per token at the same load, and each worker's share of the CPU;
            `--peers nginx,nginx2` does the same for nginx (2 workers, reuseport): what a
            second worker process costs a relay written in C on the same machine and load.
  request   `--request-concurrency` streams (128) of 4-token answers at the same pace: CPU µs per
            request (the process's CPU over the answers that ended in the window), where the
            per-request path (admission, the upstream request, the heads) outweighs the tokens.
  cost      fixed, then request, in one run: per-token and per-request cost side by side. With
            the routers in the run, each ends with issue 36's goal lines (the gateway's added TTFT
            p50 <= the best router's, p99 <= max(2.5 ms, the best router's + 1 ms), CPU per token
            <= the best router's; CPU per request <= vllm-router's), each PASS or FAIL:
              .venv/bin/python -m bench.gateway_overhead --mode cost --rounds 3 \
                  --peers tenant,vllm-router,sglang-router,nginx
`--peers` chooses the peers (default: nginx and both routers, those installed or installable).

The tenant path (`--peers tenant,tenant-redis`, with or without other peers): beside the gateway
driven with the unified key (no limits), a gateway driven with a virtual key from its SQLite key
store that has rpm, tpm and max_concurrency on, each so high that none ever refuses (the point is
what checking and counting them costs): `tenant` counts them in the process's memory (one process,
no Redis), `tenant-redis` in a redis-server the bench starts on a free port ([gateway].redis_url;
Debian's redis-server, as scripts/setup-system installs it). Each is printed as a relay vs direct,
and against the unified key (`tenant_vs_gateway`: the added TTFT p50 and p99 in ms, the CPU per
token ratio; redis-server's own CPU per token apart). In `fixed`, a verdict line for each against
issue 35's goal (at most +0.2 ms TTFT p50 and 1.05x the CPU per token of the unified key, no request
refused) says PASS or FAIL, and the bench exits 1 when one says FAIL; beside its TTFT, each gateway
target's own time before the head (x-zerogap-overhead-ms, upstream waits left out), which a busy
machine's run queue moves far less. With `--together` the tenant targets and the unified key's
gateway are driven at the same time, each with its own streams, so that their comparison sees one
moment's load rather than two: on a machine with cores to spare for that (above its cores it
starves them all).
The traced path (`--peers traced`, issue 41): a gateway with [observability] on, `--trace-ratio` (0.1)
of its requests sampled and exported over OTLP/HTTP to a sink the bench starts (bench/_otlp_sink.py,
its CPU apart), held against the gateway untraced as the tenants are (`traced_vs_gateway`, and a
verdict line with the same bounds); `--together` drives it beside the gateway too.
`--peers floor` adds bench/_relay_floor.py (issue 36): the least a completion relay in CPython does
per request (httptools and uvloop callbacks on both sides, the key checked and the body parsed
once, nothing else): how low a Python data plane could go, beside the gateway and the routers.
`--baseline DIR` adds a gateway run from another source tree (a `git worktree` or `git archive`
of an older commit) as one more target: before and after, side by side.

Every figure is printed as the median over the rounds with its [min..max]. A relay whose
CPU is near a full core is at its limit; the load generator's CPU is printed too, and the
bench says so when it was the one at its limit (then the figure is a floor, not a limit).

    .venv/bin/python -m bench.gateway_overhead [--mode both] [--rounds 5] [--concurrency 256] [--peers ...]
    .venv/bin/python -m bench.gateway_overhead --mode fixed --rounds 3 --peers tenant,tenant-redis [--together]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench._peers import (
    NGINX_INSTALL,
    PEERS,
    REDIS_INSTALL,
    ROUTERS,
    find_nginx,
    find_redis,
    install_routers,
    nginx_command,
    redis_command,
)
from bench._report import FLOOR, TENANTS, TRACED, TWO_WORKERS, report
from common.commands import zerogap_command
from common.net import free_port, wait_for_port
from common.process_group import stop_process

REPO = Path(__file__).resolve().parent.parent
KEY = "bench-unified-key"
TENANT_LIMITS = ("--rpm", "1000000000", "--tpm", "1000000000000", "--max-concurrency", "100000")  # the most a
# key may have: every limit is checked and counted on every request, and none ever refuses one

MODES = {  # upstream timing, tokens per request (± spread), warm-up and measured seconds per round
    "fixed": {"ttft_s": 0.05, "interval_s": 0.05, "num_tokens": 64, "tokens_spread": 32, "warmup_s": 4.0,
              "round_s": 8.0},
    "saturate": {"ttft_s": 0.0, "interval_s": 0.002, "num_tokens": 64, "tokens_spread": 0, "warmup_s": 2.0,
                 "round_s": 5.0},
    "request": {"ttft_s": 0.05, "interval_s": 0.05, "num_tokens": 4, "tokens_spread": 0, "warmup_s": 4.0,
                "round_s": 8.0},
}  # fmt: skip
MODES["workers"] = MODES["saturate"]
RUNS = {"both": ("fixed", "saturate"), "cost": ("fixed", "request")}  # --mode NAME: the modes it runs, in order


def gateway_config(
    tmp: Path, port: int, up_port: int, redis_url: str | None = None, trace_url: str | None = None, ratio: float = 0.1
) -> Path:
    tmp.mkdir()
    config = tmp / "config.toml"
    shared = f'redis_url = "{redis_url}"\n' if redis_url else ""  # the tenant-redis target's limits
    traces = f'[observability]\notlp_endpoint = "{trace_url}"\nsample_ratio = {ratio}\n' if trace_url else ""
    config.write_text(
        f'[server]\nport = {port}\napi_key = "${{TAOTOKEN_API_KEY}}"\n'
        f'base_url = "http://127.0.0.1:{port}/api"\n[gateway]\nkey_store = "keys.db"\n'
        "health_interval_s = 3600.0\n"  # checked once at start: the bench measures the relay, not a starved check
        f"{shared}"
        f'[logging]\nlevel = "warning"\n{traces}'
        f'[[backends]]\nname = "up"\nurl = "http://127.0.0.1:{up_port}"\nmodel = "bench"\n'
    )
    return config


def create_tenant_key(config: Path, env: dict[str, str]) -> str:
    """A virtual key in the gateway's SQLite key store with rpm, tpm and max_concurrency on (TENANT_LIMITS),
    made as a user makes one (`zerogap keys create`); its secret."""
    cmd = zerogap_command("keys", "create", "--config", str(config), "--name", "bench-tenant", *TENANT_LIMITS)
    out = subprocess.run(cmd, cwd=REPO, env=env, check=True, capture_output=True, text=True).stdout
    return out.split()[0]


def tree_pids(proc: subprocess.Popen[bytes]) -> str:
    """The process and its children (nginx's worker, the gateway's --workers), as PID,PID,..."""
    import psutil

    return ",".join(str(p) for p in [proc.pid, *(c.pid for c in psutil.Process(proc.pid).children(recursive=True))])


class Stack:
    """The processes of one mode's run: what the load generator drives (`targets`) and whose CPU it reads."""

    def __init__(self, tmp: Path, env: dict[str, str]) -> None:
        self.tmp = tmp
        self.env = env
        self.procs: list[subprocess.Popen[bytes]] = []
        self.targets: list[str] = []
        self.watch: list[str] = []
        self.keys: dict[str, str] = {}  # target -> the key the load generator sends it (else the unified key)

    def add(
        self,
        name: str,
        cmd: list[str],
        port: int,
        cwd: Path = REPO,
        env: dict[str, str] | None = None,
        target: bool = True,
    ) -> None:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env or self.env, stdout=subprocess.DEVNULL)
        self.procs.append(proc)
        wait_for_port(port, 60, proc)
        time.sleep(1.0)  # every worker up
        self.watch.append(f"{name}={tree_pids(proc)}")
        if target:
            self.targets.append(f"{name}=http://127.0.0.1:{port}")
        if name in TWO_WORKERS:  # each worker's CPU too: the share of the work each one does
            import psutil

            for i, child in enumerate(psutil.Process(proc.pid).children()):
                self.watch.append(f"{name}.w{i}={child.pid}")

    def upstream(self, m: dict[str, float]) -> int:
        port = free_port()
        self.add("upstream", [sys.executable, "-m", "bench._upstream", "--port", str(port), "--ttft-s",
                              str(m["ttft_s"]), "--interval-s", str(m["interval_s"]), "--num-tokens",
                              str(int(m["num_tokens"])), "--tokens-spread", str(int(m["tokens_spread"]))],
                 port, target=False)  # fmt: skip
        self.targets.append(f"direct=http://127.0.0.1:{port}")
        return port

    def gateway(
        self,
        name: str,
        up_port: int,
        num_workers: int = 1,
        src: Path = REPO,
        tenant: bool = False,
        redis_url: str | None = None,
        trace_url: str | None = None,
        ratio: float = 0.1,
    ) -> None:
        """A gateway process; with `tenant`, driven with a virtual key that has limits (TENANT_LIMITS),
        counted in its memory or, with `redis_url`, in that Redis."""
        port = free_port()
        config = gateway_config(self.tmp / name, port, up_port, redis_url, trace_url, ratio)
        env = {**self.env, "PYTHONPATH": str(src)}
        if tenant:
            self.keys[name] = create_tenant_key(config, env)
        cmd = zerogap_command("gateway", "--config", str(config))
        cmd += ["--workers", str(num_workers)] if num_workers > 1 else []
        self.add(name, cmd, port, cwd=src, env=env)

    def otlp_sink(self) -> str:
        """An OTLP/HTTP sink for the traced target's spans (its CPU is watched as `otlp-sink`); its URL."""
        port = free_port()
        self.add("otlp-sink", [sys.executable, "-m", "bench._otlp_sink", "--port", str(port)], port, target=False)
        return f"http://127.0.0.1:{port}"

    def redis(self, redis: str) -> str:
        """A redis-server for the tenant-redis target (its CPU is watched as `redis`); its URL."""
        port = free_port()
        self.add("redis", redis_command(redis, self.tmp / "redis", port), port, cwd=self.tmp, target=False)
        return f"redis://127.0.0.1:{port}/0"

    def floor(self, up_port: int) -> None:
        """bench/_relay_floor.py: the least a completion relay in CPython does per request (issue 36)."""
        port = free_port()
        self.add("floor", [sys.executable, "-m", "bench._relay_floor", "--port", str(port), "--upstream-port",
                           str(up_port), "--key", KEY], port)  # fmt: skip

    def nginx(self, nginx: str, up_port: int, name: str = "nginx", num_workers: int = 1) -> None:
        port = free_port()
        self.add(name, nginx_command(nginx, self.tmp / name, port, up_port, num_workers), port)

    def router(self, name: str, up_port: int) -> None:
        port = free_port()
        env = {k: v for k, v in self.env.items() if k != "PYTHONPATH"}
        self.add(name, ROUTERS[name].command(port, up_port, free_port()), port, cwd=self.tmp, env=env)

    def stop(self) -> None:
        for proc in reversed(self.procs):
            stop_process(proc)


def run_mode(mode: str, args: argparse.Namespace, env: dict[str, str], peers: dict[str, str]) -> dict[str, Any]:
    m = timing(mode, args)
    with tempfile.TemporaryDirectory(prefix="zerogap-bench-") as tmp_name:
        stack = Stack(Path(tmp_name), env)
        try:
            up_port = stack.upstream(m)
            stack.gateway("gateway", up_port)
            if mode == "workers" or "workers2" in peers:
                stack.gateway("workers2", up_port, num_workers=2)
            if "tenant" in peers and mode != "workers":
                stack.gateway("tenant", up_port, tenant=True)
            if "tenant-redis" in peers and mode != "workers":
                stack.gateway("tenant-redis", up_port, tenant=True, redis_url=stack.redis(peers["tenant-redis"]))
            if "traced" in peers and mode != "workers":
                stack.gateway("traced", up_port, trace_url=stack.otlp_sink(), ratio=args.trace_ratio)
            if args.baseline:
                stack.gateway("baseline", up_port, src=Path(args.baseline).resolve())
            if "floor" in peers and mode != "workers":
                stack.floor(up_port)
            if "nginx" in peers and mode != "workers":
                stack.nginx(peers["nginx"], up_port)
            if "nginx2" in peers and mode != "workers":
                stack.nginx(peers["nginx2"], up_port, "nginx2", num_workers=2)
            for name in ROUTERS:
                if name in peers and mode != "workers":
                    stack.router(name, up_port)
            rounds = drive(stack, m, args)
        finally:
            stack.stop()
    return {"mode": mode, "timing": m, "rounds": rounds}


def timing(mode: str, args: argparse.Namespace) -> dict[str, float]:
    """The mode's upstream timing and round lengths, with what the command line overrides."""
    m = dict(MODES[mode])
    own = ("round_s", "warmup_s") if mode == "request" else ()  # its answers stay 4 tokens long in `cost`
    for key in own or ("round_s", "warmup_s", "interval_s", "num_tokens", "tokens_spread"):
        if getattr(args, key) is not None:
            m[key] = getattr(args, key)
    m["concurrency"] = args.request_concurrency if mode == "request" else args.concurrency
    return m


def drive(stack: Stack, m: dict[str, float], args: argparse.Namespace) -> list[dict[str, Any]]:
    out = stack.tmp / "rounds.json"
    spread_s = m["ttft_s"] + m["num_tokens"] * m["interval_s"]
    max_tokens = int(m["num_tokens"] + m["tokens_spread"])
    cmd = [sys.executable, "-m", "bench._loadgen", "--rounds", str(args.rounds), "--concurrency",
           str(int(m["concurrency"])), "--warmup-s", str(m["warmup_s"]), "--round-s", str(m["round_s"]), "--spread-s",
           str(spread_s), "--max-tokens", str(max_tokens), "--key", KEY, "--out", str(out)]  # fmt: skip
    for t in stack.targets:
        cmd += ["--target", t]
    for w in stack.watch:
        cmd += ["--watch", w]
    for name, key in stack.keys.items():
        cmd += ["--key-for", f"{name}={key}"]
    together = [*stack.keys, *(t.split("=")[0] for t in stack.targets if t.startswith("traced="))]
    if args.together and together:
        cmd += ["--together", ",".join(["gateway", *together])]
    subprocess.run(cmd, cwd=REPO, env=stack.env, check=True)
    rounds: list[dict[str, Any]] = json.loads(out.read_text())
    return rounds


def choose_peers(args: argparse.Namespace) -> dict[str, str]:
    """The peers of this run, by name: nginx's path, or the name (routers installed on first use)."""
    names = [n for n in args.peers.split(",") if n and n != "none"] if args.peers is not None else list(PEERS)
    unknown = set(names) - {*PEERS, *TWO_WORKERS, *TENANTS, *TRACED, *FLOOR}
    if unknown:
        choices = ", ".join([*PEERS, *TWO_WORKERS, *TENANTS, *TRACED, *FLOOR])
        raise SystemExit(f"--peers: unknown {', '.join(sorted(unknown))}; choose from {choices}")
    if args.no_nginx and "nginx" in names:
        names.remove("nginx")
    peers: dict[str, str] = {}
    for name in names:
        if name in ("nginx", "nginx2"):
            nginx = find_nginx()
            if nginx is None:
                print(f"nginx is not installed ({NGINX_INSTALL}): left out", file=sys.stderr)
                continue
            peers[name] = nginx
        elif name == "tenant-redis":
            redis = find_redis()
            if redis is None:
                print(f"redis-server is not installed ({REDIS_INSTALL}): tenant-redis left out", file=sys.stderr)
                continue
            peers[name] = redis
        elif name in ("workers2", "tenant", "traced", "floor"):
            peers[name] = name
    for name in install_routers([n for n in names if n in ROUTERS]):
        peers[name] = name
    return peers


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--mode",
        choices=["fixed", "saturate", "both", "workers", "request", "cost"],
        default="both",
        help="workers: one gateway process vs `--workers 2`, both saturated, side by side; request: 4-token "
        "answers at --request-concurrency streams (CPU per request); cost: fixed, then request, in one run",
    )
    p.add_argument(
        "--baseline",
        metavar="DIR",
        help="also drive a gateway run from this source tree (e.g. a "
        "`git worktree` of an older commit), as target 'baseline': before and after, side by side",
    )
    p.add_argument(
        "--peers",
        help=f"comma-separated relays beside the gateway, from {', '.join(PEERS)} and workers2 (a gateway with "
        "--workers 2, at the same load) or nginx2 (nginx with 2 workers), tenant (a gateway driven with a "
        "virtual key with rpm, tpm and max_concurrency, limits in memory) or tenant-redis (the same, limits in "
        "a redis-server the bench starts), traced (a gateway with [observability] on, --trace-ratio of its "
        "requests sampled, exporting to an OTLP/HTTP sink the bench starts), "
        "or none (default: nginx and the routers, those that are installed; "
        "the routers are installed into the bench's own environment on first use)",
    )
    p.add_argument("--concurrency", type=int, default=256)
    p.add_argument(
        "--request-concurrency", type=int, default=128, help="streams in `request` (4-token answers; default 128)"
    )
    p.add_argument("--rounds", type=int, default=5, help="rounds per mode; each drives every target once")
    p.add_argument("--round-s", type=float, help="measured seconds per round (default: the mode's)")
    p.add_argument("--warmup-s", type=float, help="seconds before each round's window (default: the mode's)")
    p.add_argument("--interval-s", type=float, help="upstream: seconds between tokens (default: the mode's)")
    p.add_argument("--num-tokens", type=int, help="upstream: tokens per request, on average (default: the mode's)")
    p.add_argument("--tokens-spread", type=int, help="upstream: ± this many tokens (default: the mode's)")
    p.add_argument("--no-nginx", action="store_true", help="leave nginx out (as --peers without nginx)")
    p.add_argument(
        "--together",
        action="store_true",
        help="drive the tenant targets at the same time as the gateway with the unified key, in one window "
        "(each its own --concurrency streams), instead of one after the other: their comparison then sees "
        "the same moment's load (their figures vs direct include each other's load); for a machine with "
        "cores to spare",
    )
    p.add_argument("--trace-ratio", type=float, default=0.1, help="the traced target's sample_ratio (default 0.1)")
    p.add_argument("--json", help="also write every round and the summary to this file")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    peers = choose_peers(args)
    env = {**os.environ, "PYTHONPATH": str(REPO), "TAOTOKEN_API_KEY": KEY}
    results = []
    for mode in RUNS.get(args.mode, (args.mode,)):
        m = timing(mode, args)
        print(
            f"{mode}: {m['concurrency']:g} streams, upstream TTFT {1000 * m['ttft_s']:.0f} ms, a token every "
            f"{1000 * m['interval_s']:g} ms per stream, {m['num_tokens']:g} ± {m['tokens_spread']:g} tokens per "
            f"request; {args.rounds} rounds of {m['warmup_s']:g}+{m['round_s']:g} s per target"
            f"{' (the tenant targets together with the gateway)' if args.together else ''}; "
            f"{os.cpu_count()} cores, load average {load()}",
            file=sys.stderr,
            flush=True,
        )
        result = run_mode(mode, args, env, peers)
        result["summary"] = report(result["rounds"], mode, load())
        results.append(result)
    if args.json:
        Path(args.json).write_text(json.dumps(results))
    failed = [k for r in results for k, v in r["summary"].items() if k.endswith(".verdict") and v != "PASS"]
    return 1 if failed else 0


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


if __name__ == "__main__":
    raise SystemExit(main())
