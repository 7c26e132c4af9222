"""The passwords of the deploy files, tried on real servers: for the k8s manifests and for compose,
redis-server runs with the arguments they give it, and PostgreSQL is initialised as the postgres
image does with POSTGRES_PASSWORD (password auth on TCP). The gateway's own Redis limiter and
PostgreSQL key store, given the redis_url and database_url of the deploy's config.toml (host
moved to loopback), get in; with the password missing or wrong they do not."""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

from common.config.loader import load_config
from common.config.model import Config
from common.net import free_port, wait_for_port
from common.process_group import stop_process
from gateway.tenants.keys.base import KeyStoreError
from gateway.tenants.keys.postgres import PostgresStore
from gateway.tenants.limits.redis import RedisLimiter
from tests.deploy.k8s_docs import container, expand_args, find, gateway_config
from tests.deploy.paths import COMPOSE, load_yaml
from tests.deploy.secrets import COMPOSE_ENV, SECRETS
from tests.fixtures.postgres import PostgresServer, pg_bin
from tests.tools import require_tool

DEPLOYS = ["k8s", "compose"]
_COMPOSE_VAR = re.compile(r"\$\{([A-Z_]+)(?::[-?][^}]*)?\}")


def compose_interpolate(text: str, env: dict[str, str]) -> str:
    """${VAR}, ${VAR:-default}, ${VAR:?error} as compose reads them, for variables that are set."""
    return _COMPOSE_VAR.sub(lambda m: env[m.group(1)], text)


def deploy(name: str) -> tuple[Config, list[str], dict[str, str]]:
    """(the gateway's config, Redis's arguments after the program name, PostgreSQL's environment)."""
    if name == "k8s":
        env = {e["name"]: e.get("value", "") for e in container(find("StatefulSet", "postgres"))["env"]}
        env["POSTGRES_PASSWORD"] = SECRETS["POSTGRES_PASSWORD"]  # its secretKeyRef (test_k8s_security.py)
        return gateway_config(), expand_args(container(find("Deployment", "redis")), SECRETS), env
    services = load_yaml(COMPOSE)["services"]
    redis = [compose_interpolate(arg, COMPOSE_ENV) for arg in services["redis"]["command"]]
    env = {k: compose_interpolate(v, COMPOSE_ENV) for k, v in services["postgres"]["environment"].items()}
    return load_config(COMPOSE.parent / "config.toml", env=COMPOSE_ENV), redis[1:], env


def on_loopback(url: str, port: int) -> str:
    parts = urlsplit(url)
    auth = parts.netloc.rsplit("@", 1)[0] + "@" if "@" in parts.netloc else ""
    return urlunsplit(parts._replace(netloc=f"{auth}127.0.0.1:{port}"))


def with_password(url: str, password: str) -> str:
    parts = urlsplit(url)
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:{password}@{parts.hostname}:{parts.port}"))


class PasswordPostgres(PostgresServer):
    """initdb as the postgres image does it: superuser POSTGRES_USER with POSTGRES_PASSWORD,
    password (scram) auth over TCP, and the database POSTGRES_DB."""

    def __init__(self, env: dict[str, str]) -> None:
        super().__init__()
        self.env = env

    def init(self) -> PasswordPostgres:
        pwfile = self.dir / "pwfile"
        pwfile.write_text(self.env["POSTGRES_PASSWORD"])
        if self.as_root:
            shutil.chown(self.dir, "postgres", "postgres")
            shutil.chown(pwfile, "postgres", "postgres")
        self._run(pg_bin("initdb"), "-D", str(self.data), "-U", self.env["POSTGRES_USER"], f"--pwfile={pwfile}",
                  "--auth-host=scram-sha-256", "--auth-local=trust", "-E", "UTF8", "--no-sync")  # fmt: skip
        pwfile.unlink()
        self.start()
        self._run(pg_bin("createdb"), "-h", str(self.dir), "-p", str(self.port), "-U", self.env["POSTGRES_USER"],
                  self.env["POSTGRES_DB"])  # fmt: skip
        return self


@pytest.fixture(params=DEPLOYS)
def deployed(request: pytest.FixtureRequest) -> tuple[Config, list[str], dict[str, str]]:
    return deploy(request.param)


async def redis_answers(url: str) -> bool:
    limiter = RedisLimiter(url)
    try:
        return await limiter.ping()
    finally:
        await limiter.close()


async def store_opens(url: str) -> bool:
    store = PostgresStore(url)
    try:
        await store.open()
        return True
    except KeyStoreError:
        return False
    finally:
        await store.close()


@pytest.fixture
def redis(deployed: tuple[Config, list[str], dict[str, str]], tmp_path: Path) -> Iterator[int]:
    port = free_port()
    argv = [
        require_tool("redis-server"),
        *deployed[1],
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--dir",
        str(tmp_path),
    ]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL)
    try:
        wait_for_port(port, 120, proc)
        yield port
    finally:
        stop_process(proc)


def test_redis_url_opens_the_deployed_redis(deployed: tuple[Config, list[str], dict[str, str]], redis: int) -> None:
    url = on_loopback(deployed[0].gateway.redis_url or "", redis)
    assert urlsplit(url).password, "redis_url carries the password"
    assert asyncio.run(redis_answers(url))
    assert not asyncio.run(redis_answers(f"redis://127.0.0.1:{redis}/0")), "requirepass is on"
    assert not asyncio.run(redis_answers(with_password(url, "wrong-password-0000")))


def test_database_url_opens_the_deployed_postgres(deployed: tuple[Config, list[str], dict[str, str]]) -> None:
    server: Any = PasswordPostgres(deployed[2])
    try:
        server.init()
        url = on_loopback(deployed[0].gateway.database_url or "", server.port)
        assert urlsplit(url).password == deployed[2]["POSTGRES_PASSWORD"]
        assert asyncio.run(store_opens(url)), server.log.read_text(errors="replace")[-2000:]
        assert not asyncio.run(store_opens(with_password(url, "wrong-password-0000")))
    finally:
        server.close()
