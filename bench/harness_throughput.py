"""How many streamed tokens per second one core can read and record: the Locust
harness (`locust -f loadtest/ --headless`, one process: geventhttpclient, the SSE
parser, per-chunk timing, records, histograms, the timeline sampler) against a plain
asyncio + aiohttp client doing the same work (read SSE lines, json.loads each chunk,
time each content chunk, count usage tokens), side by side in one run.

Both read from the same upstream process, which streams as fast as it can (each
response is precomputed bytes, so the server's cost per token is tiny). The figure is
tokens per CPU-second of the client process (what one fully busy core reads), which
holds up on a shared machine better than tokens per wall second (printed too).

    .venv/bin/python -m bench.harness_throughput [--streams 32] [--seconds 8] [--rounds 2]

Prints each round and the ratio harness / aiohttp (target >= 0.80).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common.net import free_port, wait_for_port
from common.process_group import stop_process

REPO = Path(__file__).resolve().parent.parent
NUM_TOKENS = 256
WARMUP_S = 2.0


# ----- the upstream: precomputed SSE responses over HTTP/1.1 keep-alive -----
def _response_bytes(chat: bool = True) -> bytes:
    events = [b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n']
    for k in range(NUM_TOKENS):
        chunk = {"id": "b", "object": "chat.completion.chunk", "model": "m",
                 "choices": [{"index": 0, "delta": {"content": f" t{k}"}, "finish_reason": None}]}  # fmt: skip
        events.append(b"data: " + json.dumps(chunk).encode() + b"\n\n")
    usage = {"prompt_tokens": 8, "completion_tokens": NUM_TOKENS, "total_tokens": NUM_TOKENS + 8}
    events.append(b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n")
    events.append(b"data: [DONE]\n\n")
    body = b"".join(
        f"{len(piece):x}\r\n".encode() + piece + b"\r\n" for piece in (b"".join(events[i : i + 16]) for i in
                                                                      range(0, len(events), 16))
    )  # fmt: skip
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    return head + body + b"0\r\n\r\n"


class CannedUpstream(asyncio.Protocol):
    """Answers every completion request at once with the same canned stream (a public face: the
    harness client's tests serve from it too)."""

    RESPONSE = _response_bytes()
    NOT_FOUND = b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: Any = transport
        self.buffer = b""

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buffer[:end].decode("latin-1")
            length = 0
            for line in head.split("\r\n")[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            if len(self.buffer) < end + 4 + length:
                return
            self.buffer = self.buffer[end + 4 + length :]
            completions = head.startswith("POST") and "/completions" in head.split("\r\n", 1)[0]
            self.transport.write(self.RESPONSE if completions else self.NOT_FOUND)


def serve(port: int) -> None:
    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(CannedUpstream, "127.0.0.1", port)
        async with server:
            await server.serve_forever()

    asyncio.run(main())


# ----- the plain asyncio + aiohttp client -----
async def _aiohttp_stream(session: Any, url: str, body: bytes, state: dict[str, Any]) -> None:
    start = time.perf_counter()
    times: list[float] = []
    tokens = 0
    async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as response:
        async for line in response.content:
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                break
            obj = json.loads(payload)
            usage = obj.get("usage")
            if usage:
                tokens = usage["completion_tokens"]
            for choice in obj.get("choices") or ():
                if (choice.get("delta") or {}).get("content"):
                    times.append(time.perf_counter())
                    break
    if state["measuring"]:
        state["tokens"] += tokens
        state["ttft"].append(times[0] - start)
        state["itl"].extend(b - a for a, b in itertools.pairwise(times))


async def _aiohttp_main(port: int, streams: int, seconds: float) -> dict[str, float]:
    import aiohttp

    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}).encode()
    state: dict[str, Any] = {"measuring": False, "tokens": 0, "ttft": [], "itl": []}
    stop_at = time.monotonic() + WARMUP_S + seconds

    async def user(session: Any) -> None:
        while time.monotonic() < stop_at:
            await _aiohttp_stream(session, url, body, state)

    async def measure() -> tuple[float, float, float]:
        await asyncio.sleep(WARMUP_S)
        state["measuring"], cpu0, wall0 = True, time.process_time(), time.monotonic()
        await asyncio.sleep(seconds)
        state["measuring"] = False
        return state["tokens"], time.process_time() - cpu0, time.monotonic() - wall0

    connector = aiohttp.TCPConnector(limit=streams)
    async with aiohttp.ClientSession(connector=connector) as session:
        measured = asyncio.ensure_future(measure())
        await asyncio.gather(measured, *(user(session) for _ in range(streams)))
    tokens, cpu_s, wall_s = measured.result()
    return {"tokens_per_cpu_s": tokens / cpu_s, "tokens_per_s": tokens / wall_s, "cpu_percent": 100 * cpu_s / wall_s}


def run_aiohttp(port: int, streams: int, seconds: float) -> dict[str, float]:
    cmd = [sys.executable, "-m", "bench.harness_throughput", "--aiohttp-client", str(port),
           "--streams", str(streams), "--seconds", str(seconds)]  # fmt: skip
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=True, timeout=seconds + 60).stdout
    result: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    return result


# ----- the harness: the real locust run -----
def run_harness(port: int, streams: int, seconds: float, work: Path, index: int) -> dict[str, float]:
    settings = {
        "api": {"base_url": f"http://127.0.0.1:{port}", "api_key_env": ""},
        "load_test": {"steps": [streams], "warmup_seconds": WARMUP_S, "step_duration_seconds": seconds,
                      "measure_last_seconds": seconds},
        "workload": {"model": "m", "input_tokens": 8, "max_output_tokens": NUM_TOKENS, "prompt_tokens_from": "approx"},
        "metrics": {"sample_interval_ms": 500, "exporter_port": 0, "saturation_cpu_percent": 100},
        "output": {"dir": str(work), "run_name": f"harness{index}"},
    }  # fmt: skip
    path = work / f"settings{index}.json"
    path.write_text(json.dumps(settings))
    locust = str(Path(sys.executable).with_name("locust"))
    cmd = [locust, "-f", str(REPO / "loadtest"), "--headless", "--settings", str(path), "--only-summary"]
    subprocess.run(cmd, cwd=REPO, capture_output=True, check=True, timeout=seconds + 90)
    step = json.loads((work / f"harness{index}" / "report.json").read_text())["steps"][0]
    cpu = step["loadgen_cpu_percent"]
    return {"tokens_per_cpu_s": step["output_tps"] / (cpu / 100.0), "tokens_per_s": step["output_tps"],
            "cpu_percent": cpu}  # fmt: skip


def _line(name: str, result: dict[str, float]) -> str:
    return (f"  {name:<8} {result['tokens_per_cpu_s']:>10,.0f} tokens/CPU-s  {result['tokens_per_s']:>10,.0f} tokens/s"
            f"  client CPU {result['cpu_percent']:>4.0f}%")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--serve", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--aiohttp-client", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        serve(args.serve)
        return 0
    if args.aiohttp_client:
        print(json.dumps(asyncio.run(_aiohttp_main(args.aiohttp_client, args.streams, args.seconds))))
        return 0
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "bench.harness_throughput", "--serve", str(port)], cwd=REPO)
    harness, plain = [], []
    try:
        wait_for_port(port, proc=server)
        with tempfile.TemporaryDirectory() as tmp:
            for index in range(args.rounds):
                harness.append(run_harness(port, args.streams, args.seconds, Path(tmp), index))
                plain.append(run_aiohttp(port, args.streams, args.seconds))
                print(f"round {index + 1}: {args.streams} streams x {NUM_TOKENS} tokens, {args.seconds:g} s measured")
                print(_line("harness", harness[-1]))
                print(_line("aiohttp", plain[-1]))
    finally:
        stop_process(server)
    h = statistics.median(r["tokens_per_cpu_s"] for r in harness)
    p = statistics.median(r["tokens_per_cpu_s"] for r in plain)
    print(f"harness / aiohttp, tokens per CPU-second (median of {args.rounds}): {h:,.0f} / {p:,.0f} = {h / p:.2f} "
          f"(target >= 0.80) on {os.cpu_count()} cores")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
