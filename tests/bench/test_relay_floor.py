"""bench/_relay_floor.py, the measuring stick of issue 36, relays whole answers (a floor that dropped
chunks or skipped the key would read cheaper than it is): real processes on free ports, real HTTP."""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
from collections.abc import Iterator

import pytest

from common.net import free_port, wait_for_port
from common.process_group import stop_process
from tests.support import REPO

KEY = "floor-key"
NUM_TOKENS = 5


@pytest.fixture
def floor_port() -> Iterator[int]:
    up_port, port = free_port(), free_port()
    upstream = subprocess.Popen([sys.executable, "-m", "bench._upstream", "--port", str(up_port), "--ttft-s", "0.01",
                                 "--interval-s", "0.01", "--num-tokens", str(NUM_TOKENS), "--tokens-spread", "0"],
                                cwd=REPO)  # fmt: skip
    floor = subprocess.Popen([sys.executable, "-m", "bench._relay_floor", "--port", str(port), "--upstream-port",
                              str(up_port), "--key", KEY], cwd=REPO)  # fmt: skip
    try:
        wait_for_port(up_port, 30, upstream)
        wait_for_port(port, 30, floor)
        yield port
    finally:
        stop_process(floor)
        stop_process(upstream)


def post(port: int, body: bytes, key: str = KEY) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("POST", "/v1/completions", body, {"Authorization": f"Bearer {key}"})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def test_the_floor_relays_every_chunk_and_checks_the_key_and_the_body(floor_port: int) -> None:
    body = json.dumps({"model": "bench", "prompt": "hi", "stream": True, "max_tokens": NUM_TOKENS}).encode()
    for _ in range(2):  # the second on the kept-alive upstream connection
        status, raw = post(floor_port, body)
        events = [line[6:] for line in raw.split(b"\n") if line.startswith(b"data: ")]
        assert status == 200 and events[-1] == b"[DONE]", raw[-300:]
        texts = [json.loads(e)["choices"][0]["text"] for e in events[:-1]]
        assert texts == [f" t{k}" for k in range(NUM_TOKENS)], texts
    assert post(floor_port, body, key="wrong")[0] == 401
    assert post(floor_port, b"{not json")[0] == 400
