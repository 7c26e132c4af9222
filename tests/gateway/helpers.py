"""A real gateway (uvicorn, real sockets) in a background thread, and configs for it."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import aiohttp
import uvicorn

from common.config import Config, parse_config
from common.net import free_port
from common.promtext import sum_samples
from gateway.app import create_app
from gateway.cli import http_limits
from gateway.gateway import Gateway
from gateway.server.http_limits import protocol_class
from gateway.upstream.client import UpstreamClient
from tests.sse import data_payloads

UNIFIED = "unified-secret-123"
METRICS_KEY = "metrics-secret-helpers-456"  # make_config(per_key=True): /metrics names each key


def make_config(
    tmp_path: Path,
    backends: Iterable[tuple[str, str, str]],
    gateway: dict[str, Any] | None = None,
    api_key: str = UNIFIED,
    port: int = 0,
    extra: str = "",
    admin_key: str = "",
    per_key: bool = False,
) -> Config:
    """backends: (name, url, model) triples; gateway: [gateway] keys. per_key: [server].metrics_key
    is METRICS_KEY, so /metrics (read with auth(METRICS_KEY)) labels each series with its key's name."""
    port = port or free_port()
    settings = {"key_store": "keys.db", "health_interval_s": 0.2, "load_scrape_interval_s": 0.1, **(gateway or {})}
    lines = [
        "[server]",
        f'port = {port}\napi_key = "{api_key}"\nbase_url = "http://127.0.0.1:{port}/api"\nadmin_key = "{admin_key}"',
        f'metrics_key = "{METRICS_KEY if per_key else ""}"',
        "[gateway]",
        *(f"{k} = {json.dumps(v)}" for k, v in settings.items()),
    ]
    for name, url, model in backends:
        lines += ["[[backends]]", f'name = "{name}"\nurl = "{url}"\nmodel = "{model}"']
    text = "\n".join(lines) + "\n" + extra
    return parse_config(text, str(tmp_path / "config.toml"), env={}, base_dir=tmp_path)


class _ClosingServer(uvicorn.Server):
    """uvicorn's server that closes what is still open when its shutdown is over: a request it
    cancelled at its graceful timeout (a client still sending its body) is answered 500 with a
    lingering close (gateway/server/lingering.py), which would end after the thread's event loop has:
    its transport left open, a ResourceWarning in whichever test the collector next ran in."""

    async def shutdown(self, sockets: list[Any] | None = None) -> None:
        await super().shutdown(sockets)
        for connection in list(self.server_state.connections):
            connection.transport.abort()


class GatewayServer:
    """uvicorn serving create_app(config) on its own thread and event loop, with the gateway's own
    HTTP protocol (gateway/server/http_limits.py: the [server] limits, lingering close)."""

    def __init__(self, config: Config, client: UpstreamClient | None = None) -> None:
        self.config = config
        self.app = create_app(config, client)
        s = config.server
        self.server = _ClosingServer(
            uvicorn.Config(
                self.app,
                host="127.0.0.1",
                port=config.server.port,
                loop="asyncio",
                http=protocol_class(http_limits(config)),  # every [server] limit, as `zerogap gateway` applies them
                ws="none",
                proxy_headers=bool(s.forwarded_allow_ips),
                forwarded_allow_ips=list(s.forwarded_allow_ips),
                access_log=False,
                log_config=None,
                lifespan="on",
                timeout_graceful_shutdown=2,
            )
        )
        self.thread = threading.Thread(target=self.server.run, name="gateway", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.config.server.port}"

    @property
    def gw(self) -> Gateway:
        gw: Gateway = self.app.state.gateway
        return gw

    def __enter__(self) -> GatewayServer:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("gateway did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)


def auth(key: str = UNIFIED) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def chat_body(model: str = "m", stream: bool = True, **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "say hello"}], "stream": stream, **extra}


async def post(url: str, body: Any, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    timeout = aiohttp.ClientTimeout(total=20)
    async with aiohttp.ClientSession(timeout=timeout) as s, s.post(url, json=body, headers=headers) as resp:
        return resp.status, dict(resp.headers), await resp.read()


async def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    async with aiohttp.ClientSession() as s, s.get(url, headers=headers) as resp:
        return resp.status, await resp.read()


def events(raw: bytes) -> list[str]:
    """The data: payloads of an SSE body."""
    return data_payloads(raw)


def error_of(raw: bytes) -> dict[str, Any]:
    obj = json.loads(raw)
    assert set(obj) == {"error"} and set(obj["error"]) == {"message", "type", "param", "code"}, obj
    err: dict[str, Any] = obj["error"]
    return err


async def wait_until(predicate: Any, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        await asyncio.sleep(0.02)
    return bool(predicate())


def metric(text: bytes, name: str, **labels: str) -> float:
    """Sum of the samples of `name` whose labels include `labels`."""
    return sum_samples(text, name, labels) or 0.0
