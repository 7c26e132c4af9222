"""Python function calls per request: the gateway beside the CPython floor (issue 36), counted, not timed.

    .venv/bin/python -m bench.request_calls [--requests 2000] [--concurrency 8] [--tokens 4]

CPU per request (bench/gateway_overhead.py --mode request) moves with the machine's load; the
number of Python function calls a request costs does not, so it shows what a change to the
request path saves on any machine, in one run. Each target (the gateway with the unified key, and
bench/_relay_floor.py) runs twice under cProfile in front of the same upstream (bench/_upstream.py,
streamed answers of --tokens tokens): once with a warm-up only, once with the warm-up and
--requests more; the difference, over --requests, is one request's calls (times under the profiler
are left out: they hold the event loop's idle waits and the profiler's own cost). Printed: calls
per request for each, their ratio, and the gateway's functions called the most per request. `--max-ratio R` makes the
run fail (exit 1) when the gateway makes more than R times the floor's calls.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pstats
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from common.net import free_port, wait_for_port
from common.process_group import stop_process

KEY = "sk-bench-calls-0123456789abcdef"
REPO = Path(__file__).resolve().parent.parent
WARMUP_REQUESTS = 200
Row = tuple[str, float]  # (function, calls per request)


async def _drive(port: int, num_requests: int, concurrency: int, num_tokens: int) -> int:
    """num_requests streamed chat completions over `concurrency` kept-alive connections; each read to its end."""
    body = json.dumps({"model": "bench", "stream": True, "max_tokens": num_tokens,
                       "messages": [{"role": "user", "content": "hello there"}]}).encode()  # fmt: skip
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer {KEY}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    done = 0

    async def connection(count: int) -> None:
        nonlocal done
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for _ in range(count):
            writer.write(head + body)
            answer = b""
            while not answer.endswith(b"0\r\n\r\n"):
                chunk = await asyncio.wait_for(reader.read(65536), 30)
                if not chunk:
                    raise RuntimeError(f"the target closed the connection: {answer[:300]!r}")
                answer += chunk
            if b"[DONE]" not in answer:
                raise RuntimeError(f"no [DONE] in the answer: {answer[:300]!r}")
            done += 1
        writer.close()
        await writer.wait_closed()

    shares = [num_requests // concurrency + (i < num_requests % concurrency) for i in range(concurrency)]
    await asyncio.gather(*(connection(n) for n in shares if n))
    return done


def _gateway_cmd(workdir: Path, port: int, up_port: int) -> list[str]:
    (workdir / "config.toml").write_text(
        f'[server]\nport = {port}\napi_key = "{KEY}"\n'
        '[gateway]\nkey_store = "keys.db"\nhealth_interval_s = 3600.0\n[logging]\nlevel = "warning"\n'
        f'[[backends]]\nname = "up"\nurl = "http://127.0.0.1:{up_port}"\nmodel = "bench"\n'
    )
    return ["-m", "zerogap", "gateway", "--config", str(workdir / "config.toml")]


def _floor_cmd(workdir: Path, port: int, up_port: int) -> list[str]:
    return ["-m", "bench._relay_floor", "--port", str(port), "--upstream-port", str(up_port), "--key", KEY]


TARGETS = {"gateway": _gateway_cmd, "floor": _floor_cmd}


@contextmanager
def _process(cmd: list[str], cwd: Path, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as out:
        env = {**os.environ, "PYTHONPATH": str(REPO)}  # bench/ is no installed package
        env.pop("TAOTOKEN_API_KEY", None)
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield proc
    finally:  # the profiled target has had its SIGINT (_profile); the upstream writes no profile
        stop_process(proc)


def _profile(target: str, num_requests: int, args: argparse.Namespace, workdir: Path) -> pstats.Stats:
    """The target's profile after the warm-up and num_requests more."""
    up_port, port = free_port(), free_port()
    out = workdir / f"{target}-{num_requests}.prof"
    up_cmd = [sys.executable, "-m", "bench._upstream", "--port", str(up_port), "--ttft-s", "0.002",
              "--interval-s", "0.002", "--num-tokens", str(args.tokens)]  # fmt: skip
    cmd = [sys.executable, "-m", "cProfile", "-o", str(out), *TARGETS[target](workdir, port, up_port)]
    with _process(up_cmd, REPO, workdir / "upstream.log"), _process(cmd, workdir, workdir / f"{target}.log") as proc:
        wait_for_port(up_port, 30)
        try:
            wait_for_port(port, 60, proc)
        except RuntimeError as exc:
            raise SystemExit(f"{target}: {exc}:\n{(workdir / f'{target}.log').read_text()[-3000:]}") from None
        for count in (WARMUP_REQUESTS, num_requests):
            if count and asyncio.run(_drive(port, count, args.concurrency, args.tokens)) != count:
                raise SystemExit(f"{target}: not every request was answered (its log: {workdir / target}.log)")
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            raise SystemExit(f"{target} did not end within 60 s of SIGINT: {workdir / target}.log") from None
    deadline = time.monotonic() + 10
    while not out.is_file() and time.monotonic() < deadline:
        time.sleep(0.05)
    return pstats.Stats(str(out))


def per_request(before: pstats.Stats, after: pstats.Stats, num_requests: int) -> list[Row]:
    """Each function's calls per request: the growth from `before` to `after`."""
    rows = []
    for func, (_, calls, _, _, _) in after.stats.items():  # type: ignore[attr-defined]
        _, calls_before, _, _, _ = before.stats.get(func, (0, 0, 0.0, 0.0, {}))  # type: ignore[attr-defined]
        name = f"{Path(func[0]).name}:{func[1]} {func[2]}" if func[0] != "~" else func[2]
        rows.append((name, (calls - calls_before) / num_requests))
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=2000, help="measured requests per target (default 2000)")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--tokens", type=int, default=4, help="tokens per streamed answer (default 4)")
    p.add_argument("--top", type=int, default=15, help="the gateway's functions listed (default 15)")
    p.add_argument(
        "--max-ratio", type=float, help="fail when the gateway makes more than this many times the floor's calls"
    )
    args = p.parse_args(argv)
    totals: dict[str, float] = {}
    rows: dict[str, list[Row]] = {}
    with tempfile.TemporaryDirectory(prefix="zerogap-calls-") as tmp:
        for target in TARGETS:
            workdir = Path(tmp) / target
            workdir.mkdir()
            before, after = _profile(target, 0, args, workdir), _profile(target, args.requests, args, workdir)
            rows[target] = per_request(before, after, args.requests)
            totals[target] = sum(calls for _, calls in rows[target])
    print(f"Python calls per streamed request ({args.tokens}-token answers, {args.requests} requests, "
          f"{args.concurrency} connections):")  # fmt: skip
    for target, calls in totals.items():
        print(f"  {target:8} {calls:8.1f}")
    ratio = totals["gateway"] / totals["floor"]
    print(f"  gateway / floor: {ratio:.2f}x")
    print(f"the gateway's most called, per request (of {totals['gateway']:.0f}):")
    for name, calls in sorted(rows["gateway"], key=lambda r: -r[1])[: args.top]:
        print(f"  {calls:7.2f}  {name}")
    if args.max_ratio is not None and ratio > args.max_ratio:
        print(f"FAIL: {ratio:.2f}x the floor's calls > --max-ratio {args.max_ratio}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
