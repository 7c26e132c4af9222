"""Issue 35: a request body never stalls the event loop. A real gateway process relays a victim's
stream (a token every 20 ms from the scripted upstream) while two other connections send 4 MiB
worst-case bodies back to back: nested lists 61 deep (refused past the budget, which the gateway
before decoded for seconds) and the largest body within the budget (decoded, then 404).

The verdicts depend on events, not on the machine's speed:
- the victim's lag: each content chunk's arrival at the client minus its write at the upstream
  (both on time.time(): an upstream that overslept is not counted), the longest during the attack
  minus the longest alone, stays under 50 ms scaled by how slow this machine is right now (the
  time this process takes to json.loads the deep body, before and after the attack, the slower,
  against that time on a quiet machine), and never under 0.75 s of scheduling noise (other test
  workers beside it took 270 ms of the CPU once); the old code's lag was the whole decode, seconds;
- the gateway's CPU time per attacking body stays under a quarter of the CPU time of that same
  json.loads (the old code spent more than the whole of it on the deep body).
Run with two busy processes beside it too: neither verdict may flip. With the previous decoder put
back by hand the victim's lag was 2.8-3.6 s against a bound of 0.17-0.34 s, and the gateway spent
528 ms of CPU per body against a bound of 315 ms: both fail.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import aiohttp
import psutil
import pytest

from bench.body_parse import counted, filled
from common.net import free_port
from gateway.server.body_scan import MAX_VALUES
from tests.fixtures.upstream import Behavior, UpstreamServer
from tests.gateway.processes import UNIFIED, GatewayProcess, write_config
from tests.gateway.raw_http import Conn, request

pytestmark = pytest.mark.slow

INTERVAL_S = 0.02
TOKENS = 120  # 2.4 s of stream
TARGET_S = 0.05  # the bound on the added lag, on a quiet machine (bench/body_parse.py measures it)
NOISE_FLOOR_S = 0.75  # the scheduling noise a busy CI machine adds to a wall-clock lag
QUIET_REFERENCE_S = 0.75  # json.loads of DEEP on the quiet 2-core development machine
DEEP = filled(b"[" * 61 + b"]" * 61)
WITHIN = counted(b"123456", MAX_VALUES - 16)


@pytest.fixture
def busy(request: pytest.FixtureRequest) -> Iterator[None]:
    """`request.param` processes spinning on a core each, for the test's duration."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(request.param)]
    yield
    for spinner in spinners:
        spinner.kill()
        spinner.wait()


@pytest.fixture
def served(tmp_path) -> Iterator[tuple[GatewayProcess, UpstreamServer]]:
    behavior = Behavior(interval_s=INTERVAL_S, num_output_tokens=TOKENS)
    with UpstreamServer(behavior, model="m") as up:
        port = free_port()
        with GatewayProcess(write_config(tmp_path / "config.toml", port, up.url, {}), port) as gw:
            yield gw, up


async def victim_lags(gw: GatewayProcess, up: UpstreamServer) -> list[float]:
    """One streamed request through the gateway; each content chunk's arrival minus its write upstream."""
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": TOKENS, "stream": True}
    arrivals: list[float] = []
    headers = {"Authorization": f"Bearer {UNIFIED}"}
    async with aiohttp.ClientSession() as session, session.post(gw.url + "/v1/chat/completions", json=body,
                                                                headers=headers) as resp:  # fmt: skip
        assert resp.status == 200
        pending = b""
        async for data in resp.content.iter_any():
            now = time.time()
            pending += data
            *events, pending = pending.split(b"\n\n")
            for event in events:
                payload = event.removeprefix(b"data: ")
                if payload != b"[DONE]" and any(c["delta"].get("content") for c in json.loads(payload)["choices"]):
                    arrivals.append(now)
    written = [when for when, _ in up.requests[-1].chunk_walls]
    assert len(arrivals) == len(written) == TOKENS
    return [arrived - sent for arrived, sent in zip(arrivals, written, strict=True)]


def attack(port: int, bodies: list[bytes], stop: threading.Event, answers: list[int]) -> None:
    """Send the bodies in turn, one request per connection, until `stop`; each answer's status."""
    headers = {"Authorization": f"Bearer {UNIFIED}", "Content-Type": "application/json"}
    requests = [request("POST", "/v1/chat/completions", headers, body) for body in bodies]
    while not stop.is_set():
        for sent in requests:
            with Conn(port, timeout_s=120) as conn:
                conn.sendall(sent)
                answers.append(conn.read_response().status)


def reference() -> tuple[float, float]:
    """How long this process takes to json.loads the deep body now, in wall time (the machine's
    speed under its present load) and in CPU time (the best of two each)."""
    wall = cpu = float("inf")
    for _ in range(2):
        start_wall, start_cpu = time.perf_counter(), time.thread_time()
        json.loads(DEEP)
        wall, cpu = min(wall, time.perf_counter() - start_wall), min(cpu, time.thread_time() - start_cpu)
    return wall, cpu


@pytest.mark.parametrize("busy", [0, 2], indirect=True, ids=["alone", "two-busy-processes"])
async def test_worst_case_bodies_do_not_stall_another_tenants_stream(served, busy) -> None:
    gw, up = served
    await victim_lags(gw, up)  # warm: connections, first-request paths
    before = reference()
    alone = max(await victim_lags(gw, up))

    assert gw.proc is not None
    gateway = psutil.Process(gw.proc.pid)
    stop, answers = threading.Event(), list[int]()
    attackers = [threading.Thread(target=attack, args=(gw.port, [DEEP, WITHIN], stop, answers)) for _ in range(2)]
    cpu_before = sum(gateway.cpu_times()[:2])
    for attacker in attackers:
        attacker.start()
    try:
        await asyncio.to_thread(lambda: up.wait_for(lambda _: len(answers) >= 2, timeout_s=120))
        attacked = max(await victim_lags(gw, up))
        answered = len(answers)
    finally:
        stop.set()
        for attacker in attackers:
            await asyncio.to_thread(attacker.join, 300)
    cpu_per_body = (sum(gateway.cpu_times()[:2]) - cpu_before) / len(answers)
    after = reference()  # the machine's speed on both sides of the attack: the slower counts
    reference_wall, reference_cpu = max(before[0], after[0]), max(before[1], after[1])
    # the wall-clock lag also holds what other processes took of the CPU meanwhile (a CI run's other
    # test workers took 270 ms of it once, the body costing ~20 ms): never under NOISE_FLOOR_S; the
    # old code's lag was seconds. The CPU per body below is the tight verdict.
    bound = max(NOISE_FLOOR_S, TARGET_S * max(1.0, reference_wall / QUIET_REFERENCE_S))
    print(f"victim's longest lag: alone {alone * 1000:.1f} ms, attacked {attacked * 1000:.1f} ms "
          f"(bound {bound * 1000:.0f} ms); gateway CPU per body {cpu_per_body * 1000:.1f} ms, "
          f"json.loads of the deep body here {reference_wall * 1000:.0f} ms ({reference_cpu * 1000:.0f} ms CPU); "
          f"{len(answers)} bodies")  # fmt: skip
    assert set(answers) <= {400, 404} and 404 in answers  # the within-budget body was decoded and routed
    assert answered >= 4, answers  # bodies kept coming while the victim streamed
    assert attacked - alone < bound
    assert cpu_per_body < reference_cpu / 4
