"""[logging].request_log: one JSON line per completion request (streamed, not, refused, gone),
whose charged tokens add up to /admin/usage; rotated past its size; or on standard output.
And x-zerogap-overhead-ms on a stream whose head a keep-alive sent before any answer came."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gateway.observe.request_log import RequestLog
from tests.fixtures.upstream import Behavior, UpstreamServer
from tests.gateway.helpers import GatewayServer, auth, chat_body, get, make_config, post, wait_until

ADMIN = "admin-request-log-key-01234"
FIELDS = {"time", "request_id", "key", "model", "engine", "status", "error", "prompt_tokens", "completion_tokens",
          "ttft_ms", "duration_ms", "overhead_ms", "retries", "continuations", "finish_reasons", "client", "path",
          "stream", "trace_id"}  # fmt: skip


def logged_gateway(tmp_path: Path, url: str, log: str, extra: str = "", **gateway: Any) -> GatewayServer:
    config = make_config(tmp_path, [("b0", url, "m")], gateway=gateway, admin_key=ADMIN,
                         extra=f'[logging]\nrequest_log = "{log}"\n{extra}')  # fmt: skip
    return GatewayServer(config)


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


async def new_key(gs: GatewayServer, name: str, **limits: int) -> str:
    async with aiohttp.ClientSession() as s:
        body = {"name": name, **limits}
        async with s.post(gs.url + "/admin/keys", json=body, headers=auth(ADMIN)) as r:
            assert r.status == 201
            key: str = (await r.json())["key"]
            return key


async def test_the_lines_parse_and_add_up_to_admin_usage(tmp_path) -> None:
    log = tmp_path / "requests.jsonl"
    with (
        UpstreamServer(Behavior(num_output_tokens=4), model="m") as up,
        logged_gateway(tmp_path, up.url, str(log)) as gs,
    ):
        a, b = await new_key(gs, "team-a"), await new_key(gs, "team-b", rpm=2)
        url = gs.url + "/v1/chat/completions"
        answers = [
            await post(url, chat_body(), {**auth(a), "x-request-id": "one"}),
            await post(url, chat_body(stream=False, max_tokens=3), {**auth(a), "x-request-id": "whole"}),
            await post(gs.url + "/v1/completions", {"model": "m", "prompt": "a b c", "stream": True}, auth(b)),
            await post(url, chat_body(), auth(b)),
            await post(url, chat_body(), auth(b)),  # rpm 2: refused
            await post(url, chat_body(model="nope"), auth(a)),  # 404
            await post(url, chat_body(), auth()),  # the unified key
        ]
        assert [s for s, _, _ in answers] == [200, 200, 200, 200, 429, 404, 200]
        await gs.gw.usage.flush()
        assert await wait_until(lambda: log.exists() and len(log.read_text().splitlines()) == 7)
        status, raw = await get(gs.url + "/admin/usage", auth(ADMIN))
        assert status == 200
    got = lines(log)
    assert all(set(line) == FIELDS for line in got)
    by_id = {line["request_id"]: line for line in got}
    for _, headers, _ in answers:  # each answer's x-request-id names its line
        assert {k.lower(): v for k, v in headers.items()}["x-request-id"] in by_id
    first = by_id["one"]
    assert (first["key"], first["model"], first["engine"], first["status"], first["error"]) == ("team-a", "m", "b0",
                                                                                                200, None)  # fmt: skip
    assert (first["prompt_tokens"], first["completion_tokens"], first["stream"]) == (2, 4, True)
    assert first["client"] == "127.0.0.1" and first["ttft_ms"] > 0 and first["duration_ms"] >= first["ttft_ms"]
    assert first["retries"] == 0 and first["continuations"] == 0 and first["time"].endswith("Z")
    assert (first["finish_reasons"], by_id["whole"]["finish_reasons"]) == (["stop"], ["length"])  # untraced too
    refused = [line for line in got if line["status"] == 429]
    assert [(r["key"], r["error"], r["engine"], r["completion_tokens"], r["finish_reasons"]) for r in refused] == [
        ("team-b", "rate_limit_requests", "none", 0, None)
    ]
    assert [line["model"] for line in got if line["status"] == 404] == ["unknown"]  # never the client's string
    # what the lines charged is what /admin/usage shows, key by key and model by model
    usage: dict[tuple[str, str], list[int]] = {}
    for line in got:
        if line["prompt_tokens"] or line["completion_tokens"]:
            row = usage.setdefault((line["key"], line["model"]), [0, 0, 0])
            row[0] += 1
            row[1] += line["prompt_tokens"]
            row[2] += line["completion_tokens"]
    admin = {(r["key"], r["model"]): [r["requests"], r["prompt_tokens"], r["completion_tokens"]]
             for r in json.loads(raw)["data"]}  # fmt: skip
    assert admin == usage and len(usage) == 3


async def test_a_client_gone_and_a_retried_request_are_logged_as_they_ended(tmp_path) -> None:
    log = tmp_path / "requests.jsonl"
    slow = Behavior(ttft_s=0.0, interval_s=0.05, num_output_tokens=200)
    with UpstreamServer(slow, model="m") as up, logged_gateway(tmp_path, up.url, str(log)) as gs:
        timeout = aiohttp.ClientTimeout(total=20)
        async with aiohttp.ClientSession(timeout=timeout) as s:
            async with s.post(gs.url + "/v1/chat/completions", json=chat_body(), headers=auth()) as resp:
                await resp.content.readline()  # the first event; then the client goes
        assert await wait_until(lambda: log.exists() and log.read_text().strip() != "")
    (line,) = lines(log)
    assert (line["status"], line["error"], line["engine"]) == (499, "client_gone", "b0")
    assert line["completion_tokens"] >= 1


def test_the_file_is_rotated_past_its_size_and_every_line_kept(tmp_path) -> None:
    path = tmp_path / "logs" / "requests.jsonl"
    writers = [RequestLog.open(str(path), Path, 0.002, 3) for _ in range(2)]  # two processes (--workers 2), ~2 KB
    for w in writers:
        assert w is not None
        w.check_every_s = 0.0  # each write looks whether the other rotated (else: once a second)
    for i in range(100):
        writers[i % 2].write({"i": i, "pad": "x" * 80})  # type: ignore[union-attr]
    for w in writers:
        w.close()  # type: ignore[union-attr]
    files = [path.with_name(n) for n in ("requests.jsonl.3", "requests.jsonl.2", "requests.jsonl.1", "requests.jsonl")]
    assert sorted(p.name for p in path.parent.iterdir()) == sorted([*(f.name for f in files), "requests.jsonl.lock"])
    assert all(os.path.getsize(f) <= 2097 + 100 for f in files)
    kept = [json.loads(line)["i"] for f in files for line in f.read_text().splitlines()]
    assert kept == list(range(kept[0], 100)) and kept[0] > 0  # in order, none lost or cut but the oldest rotated out


async def test_stdout_gets_one_line_per_request(tmp_path, capfd: pytest.CaptureFixture[str]) -> None:
    with (
        UpstreamServer(Behavior(num_output_tokens=2), model="m") as up,
        logged_gateway(tmp_path, up.url, "stdout") as gs,
    ):
        for _ in range(3):
            assert (await post(gs.url + "/v1/chat/completions", chat_body(), auth()))[0] == 200
        await asyncio.sleep(0.1)
    out = [json.loads(line) for line in capfd.readouterr().out.splitlines() if line.startswith("{")]
    assert len(out) == 3 and all(set(line) == FIELDS for line in out)


async def test_the_overhead_of_a_head_a_keepalive_sent_is_the_time_before_it_left(tmp_path) -> None:
    with (
        UpstreamServer(Behavior(ttft_s=1.0, num_output_tokens=2), model="m") as up,
        logged_gateway(tmp_path, up.url, "off", keepalive_interval_s=0.2) as gs,
    ):
        status, headers, raw = await post(gs.url + "/v1/chat/completions", chat_body(), auth())
    assert status == 200 and raw.startswith(b": keep-alive")  # the head went with the first keep-alive
    overhead_ms = float({k.lower(): v for k, v in headers.items()}["x-zerogap-overhead-ms"])
    assert 0 <= overhead_ms < 150  # not the 200 ms the keep-alive waited, nor the upstream's second


async def test_a_client_gone_before_its_body_came_is_a_line_too(tmp_path) -> None:
    log = tmp_path / "requests.jsonl"
    with UpstreamServer(Behavior(), model="m") as up, logged_gateway(tmp_path, up.url, str(log)) as gs:
        host, port = gs.url.removeprefix("http://").split(":")
        for path in ("/v1/chat/completions", "/tokenize"):
            _, writer = await asyncio.open_connection(host, int(port))
            head = (f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: {auth()['Authorization']}\r\n"
                    "Content-Type: application/json\r\nContent-Length: 1000\r\n"
                    f"x-request-id: gone-{path[-8:]}\r\n\r\n")  # fmt: skip
            writer.write(head.encode() + b'{"model": "m", ')  # a part of the body, then the client goes
            await writer.drain()
            await asyncio.sleep(0.2)
            writer.close()
            await writer.wait_closed()
        assert await wait_until(lambda: log.exists() and len(log.read_text().splitlines()) == 2)
        assert up.requests == [] and up.state.num_tokenize == 0
    got = {line["request_id"]: line for line in lines(log)}
    assert all(set(line) == FIELDS for line in got.values())
    for request_id, path in (("gone-pletions", "/v1/chat/completions"), ("gone-tokenize", "/tokenize")):
        line = got[request_id]
        assert (line["status"], line["error"], line["engine"], line["path"]) == (499, "client_gone", "none", path)
        assert (line["key"], line["prompt_tokens"], line["completion_tokens"]) == ("unified", 0, 0)
