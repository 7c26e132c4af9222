"""A client that leaves is normal: the sim frees its slot and writes no traceback (issue 42).

Clients leave at every point of a stream: half-closed right after the request (the sim's
headers then meet a closing socket), after the first token, mid-stream with a FIN or a
reset, and a stream of several choices. The sim's stderr must hold no traceback, and
every slot must be free afterwards.
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
from collections.abc import Iterator

import aiohttp
import pytest

from backends.sim.testing import SimProcess, run_sim_process

MODEL = "sim-leaves"


@pytest.fixture(scope="module")
def sim() -> Iterator[SimProcess]:
    with run_sim_process("--time-scale", "1", model=MODEL) as process:
        yield process


def _request(max_tokens: int, n: int = 1) -> bytes:
    body = json.dumps(
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "one two three"}],
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "stream": True,
            "n": n,
        }
    ).encode()
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: sim\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def _leave(port: int, how: str, delay_s: float, max_tokens: int = 3, n: int = 1) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    sock = writer.get_extra_info("socket")
    writer.write(_request(max_tokens, n))
    await writer.drain()
    if how != "half_at_once":
        await reader.read(64)  # the stream has begun
    await asyncio.sleep(delay_s)
    if how == "reset":
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    elif how != "close":
        sock.shutdown(socket.SHUT_WR)  # FIN, still reading: the sim sees EOF before it ends the stream
        await asyncio.sleep(0.3)
    writer.close()


async def _leave_in_every_way(port: int) -> None:
    for _ in range(3):
        await asyncio.gather(
            *(_leave(port, "half_at_once", 0.0) for _ in range(32)),
            *(_leave(port, "half_after_first", 0.001 * (i % 20)) for i in range(32)),
            *(_leave(port, "close", 0.05, max_tokens=500) for _ in range(16)),
            *(_leave(port, "reset", 0.05, max_tokens=500) for _ in range(16)),
            *(_leave(port, "half_at_once", 0.0, n=3) for _ in range(8)),
            *(_leave(port, "half_after_first", 0.002 * i, n=3) for i in range(8)),
        )


async def _num_running(url: str) -> int:
    async with aiohttp.ClientSession() as session:
        for _ in range(50):
            async with session.get(f"{url}/sim/stats") as response:
                stats = await response.json()
            if stats["num_running"] == 0 and stats["num_waiting"] == 0:
                return 0
            await asyncio.sleep(0.1)
    return int(stats["num_running"])


async def test_clients_that_leave_leave_no_traceback(sim):
    await _leave_in_every_way(sim.port)
    assert await _num_running(sim.url) == 0
    log = sim.log.read_text(errors="replace")
    assert "Traceback" not in log and "Error handling request" not in log, log[-3000:]
