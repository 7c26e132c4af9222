"""A real HTTP server with known server-side signals, for the parts the shared upstream
fixture does not export: the simulated engine's GPU-busy ratio, token interval and CPU interval
(/metrics, Prometheus text) and a Prometheus query API (/api/v1/query). The values
are fixed so the report's gpu_util and token_interval_ms can be checked exactly."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from aiohttp import web


class SignalServer:
    def __init__(
        self, busy_ratio: float, token_interval_s: float, dcgm_percent: float, cpu_interval_s: float = 0.0145
    ) -> None:
        self.busy_ratio = busy_ratio
        self.token_interval_s = token_interval_s
        self.cpu_interval_s = cpu_interval_s
        self.dcgm_percent = dcgm_percent
        self.port = 0
        self.num_scrapes = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def metrics(self, request: web.Request) -> web.Response:
        self.num_scrapes += 1
        text = (
            "# TYPE zerogap_sim_gpu_busy_ratio gauge\n"
            f'zerogap_sim_gpu_busy_ratio{{model_name="m"}} {self.busy_ratio}\n'
            "# TYPE zerogap_sim_token_interval_seconds gauge\n"
            f'zerogap_sim_token_interval_seconds{{model_name="m"}} {self.token_interval_s}\n'
            "# TYPE zerogap_sim_cpu_interval_seconds gauge\n"
            f'zerogap_sim_cpu_interval_seconds{{model_name="m"}} {self.cpu_interval_s}\n'
            "# TYPE vllm:kv_cache_usage_perc gauge\n"
            'vllm:kv_cache_usage_perc{model_name="m"} 0.25\n'
        )
        return web.Response(text=text, content_type="text/plain")

    async def query(self, request: web.Request) -> web.Response:
        result: list[dict[str, Any]] = [
            {"metric": {"gpu": str(gpu)}, "value": [0, str(self.dcgm_percent + delta)]}
            for gpu, delta in ((0, -10.0), (1, 10.0))
        ]
        return web.json_response({"status": "success", "data": {"resultType": "vector", "result": result}})

    async def _start(self) -> None:
        app = web.Application()
        app.add_routes([web.get("/metrics", self.metrics), web.get("/api/v1/query", self.query)])
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        server: Any = site._server
        self.port = server.sockets[0].getsockname()[1]

    def __enter__(self) -> SignalServer:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()
