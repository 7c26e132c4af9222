"""`zerogap gateway [--config config.toml]`: serve the gateway with uvicorn (uvloop + httptools)."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from common.argtypes import positive_int
from common.config import Config, ConfigError, load_config
from gateway.tenants.keys.auto import open_store
from gateway.tenants.keys.base import KeyStoreError

if TYPE_CHECKING:
    import uvicorn

    from gateway.server.http_refusals import HttpLimits

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
GC_THRESHOLDS = (20_000, 50, 100)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="zerogap gateway", description="Serve the gateway in front of the pool.")
    parser.add_argument("--config", default="config.toml", help="config file (default: ./config.toml)")
    parser.add_argument("--host", help="override [server].host")
    parser.add_argument("--port", type=int, help="override [server].port")
    parser.add_argument("--log-level", choices=["debug", "info", "warning", "error"], help="override [logging].level")
    parser.add_argument(
        "--workers", type=positive_int, default=1, help="processes serving the port (default 1); see gateway/README.md"
    )
    parser.add_argument("--reuse-port", action="store_true", help=argparse.SUPPRESS)  # one worker of --workers N
    return parser.parse_args(argv)


def _check(config: Config) -> None:
    """Fail before serving on what would otherwise fail inside the server."""
    if not config.pool():
        raise ConfigError(f"{config.source}: no backends: add [[backends]] entries or an [engine] section.")
    names = [b.name for b in config.pool()]
    if len(set(names)) != len(names):
        raise ConfigError(f"{config.source}: [[backends]]: two backends share a name. Give each its own name.")
    asyncio.run(_open_store(config))


async def _open_store(config: Config) -> None:
    """The key store opens (and its tables exist) before the server starts: a clear error, not a traceback."""
    store = open_store(config)
    try:
        await store.open()
    finally:
        await store.close()


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    try:
        config = load_config(args.config)
        if args.host:
            config.server.host = args.host
        if args.port:
            config.server.port = args.port
        _check(config)
    except (ConfigError, KeyStoreError) as exc:
        print(f"zerogap gateway: {exc}", file=sys.stderr)
        return 2
    level = args.log_level or config.logging.level
    logging.basicConfig(level=level.upper(), format=LOG_FORMAT, stream=sys.stderr)
    if args.workers > 1:
        return supervise(config, args.workers, argv)
    return serve(config, level, reuse_port=args.reuse_port)


def _bind_error(config: Config) -> int:
    print(
        f"zerogap gateway: could not serve on {config.server.host}:{config.server.port} "
        "(is the port in use? change [server].port or pass --port)",
        file=sys.stderr,
    )
    return 1


def supervise(config: Config, num_workers: int, argv: list[str]) -> int:
    from common.net import port_is_free
    from gateway.workers import STOP_GRACE_S, Supervisor, worker_argv

    if not port_is_free(config.server.host, config.server.port):
        return _bind_error(config)
    if not config.gateway.redis_url:
        logging.getLogger("zerogap.gateway").info(
            "rate limits are shared by the %d workers of this gateway only; set [gateway].redis_url "
            "to share them with other gateway hosts",
            num_workers,
        )
    grace_s = config.gateway.drain_timeout_s + STOP_GRACE_S
    return Supervisor(worker_argv(argv), num_workers, grace_s).run()


def raise_open_file_limit() -> None:
    """Two sockets per stream (client and backend): lift the soft limit on open files to the hard one."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard == resource.RLIM_INFINITY or soft < hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else 1 << 20, hard))
    except (ImportError, ValueError, OSError) as exc:  # not on this platform, or not allowed: keep the limit
        logging.getLogger("zerogap.gateway").debug("open-file limit unchanged: %s", exc)


def tune_gc() -> None:
    """Fewer, shorter collector pauses (they showed as 50-180 ms TTFT outliers at 1,000 streams):
    the objects made at start-up go to the permanent generation, and collections run less often."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_THRESHOLDS[0], GC_THRESHOLDS[1], GC_THRESHOLDS[2])


def refusal_counter(app: Any) -> Callable[[str], None]:
    """Counts the HTTP limits' refusals in the app's metrics (the gateway is made at the app's start)."""

    def count(reason: str) -> None:
        gateway = getattr(app.state, "gateway", None)
        if gateway is not None:
            gateway.metrics.http_refused.labels(reason).inc()

    return count


def http_limits(config: Config) -> HttpLimits:
    """The [server] settings the HTTP protocol applies (gateway/server/http_limits.py)."""
    from gateway.server.http_refusals import HttpLimits

    s = config.server
    return HttpLimits(
        s.max_header_bytes,
        s.header_timeout_s,
        s.body_timeout_s,
        s.max_connections,
        s.max_connections_per_client,
        s.idle_connection_timeout_s,
        tuple(s.forwarded_allow_ips),
    )


def uvicorn_config(app: Any, config: Config, level: str) -> uvicorn.Config:
    """uvicorn's settings for the gateway: httptools with the [server] HTTP limits
    (gateway/server/http_limits.py), no WebSocket (the gateway has no WebSocket route), X-Forwarded-For
    read only from [server].forwarded_allow_ips (none by default: not uvicorn's loopback default,
    nor its FORWARDED_ALLOW_IPS). Each worker of --workers N reads the same config."""
    import uvicorn

    from gateway.server.http_limits import protocol_class

    s = config.server
    return uvicorn.Config(
        app,
        host=s.host,
        port=s.port,
        loop="uvloop",
        http=protocol_class(http_limits(config), refusal_counter(app)),
        ws="none",
        proxy_headers=bool(s.forwarded_allow_ips),
        forwarded_allow_ips=list(s.forwarded_allow_ips),
        access_log=config.logging.access_log,
        log_level=level,
        log_config=None,
        lifespan="on",
        backlog=4096,
    )


def serve(config: Config, level: str, reuse_port: bool = False) -> int:
    """Serve in this process; reuse_port: bind with SO_REUSEPORT, as one worker of several."""
    import httptools  # noqa: F401  (imported now so that tune_gc freezes it too)
    import uvloop  # noqa: F401

    raise_open_file_limit()
    from gateway.app import create_app
    from gateway.pool.drain import server_for

    app = create_app(config)

    def on_drain() -> None:
        gw = getattr(app.state, "gateway", None)
        if gw is not None:
            gw.drain.begin()

    server = server_for(uvicorn_config(app, config, level), config.gateway.drain_timeout_s, on_drain)
    sockets = None
    if reuse_port:
        from gateway.workers import reuse_port_socket

        try:
            sockets = [reuse_port_socket(config.server.host, config.server.port)]
        except OSError:
            return _bind_error(config)
    tune_gc()
    try:
        server.run(sockets=sockets)
    except (KeyboardInterrupt, SystemExit):  # uvicorn exits 1 when it cannot bind
        pass
    if not server.started:
        return _bind_error(config)
    return 0
