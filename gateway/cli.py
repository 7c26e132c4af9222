"""`zerogap gateway [--config config.toml]`: serve the gateway with uvicorn (uvloop + httptools)."""

from __future__ import annotations

import argparse
import logging
import sys

from gateway.keystore import KeyStore, KeyStoreError
from zerogap.config import Config, ConfigError, load_config

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="zerogap gateway", description="Serve the gateway in front of the pool.")
    parser.add_argument("--config", default="config.toml", help="config file (default: ./config.toml)")
    parser.add_argument("--host", help="override [server].host")
    parser.add_argument("--port", type=int, help="override [server].port")
    parser.add_argument("--log-level", choices=["debug", "info", "warning", "error"], help="override [logging].level")
    return parser.parse_args(argv)


def _check(config: Config) -> None:
    """Fail before serving on what would otherwise fail inside the server."""
    if not config.pool():
        raise ConfigError(f"{config.source}: no backends: add [[backends]] entries or an [engine] section.")
    names = [b.name for b in config.pool()]
    if len(set(names)) != len(names):
        raise ConfigError(f"{config.source}: [[backends]]: two backends share a name. Give each its own name.")
    KeyStore(config.resolve_path(config.gateway.key_store)).close()


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
    return serve(config, level)


def serve(config: Config, level: str) -> int:
    import uvicorn

    from gateway.app import create_app

    server = uvicorn.Server(
        uvicorn.Config(
            create_app(config),
            host=config.server.host,
            port=config.server.port,
            loop="uvloop",
            http="httptools",
            access_log=config.logging.access_log,
            log_level=level,
            log_config=None,
            lifespan="on",
            timeout_graceful_shutdown=5,
            backlog=4096,
        )
    )
    try:
        server.run()
    except (KeyboardInterrupt, SystemExit):  # uvicorn exits 1 when it cannot bind
        pass
    if not server.started:
        print(
            f"zerogap gateway: could not serve on {config.server.host}:{config.server.port} "
            "(is the port in use? change [server].port or pass --port)",
            file=sys.stderr,
        )
        return 1
    return 0
