"""Fixtures of real servers the gateway tests share: PostgreSQL and Redis."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest

from common.net import free_port, wait_for_port
from common.process_group import stop_process
from tests.fixtures.postgres import PostgresServer
from tests.tools import require_tool


@pytest.fixture(scope="module")
def postgres() -> Iterator[PostgresServer]:
    server = PostgresServer()
    try:
        yield server.init()
    finally:
        server.close()


@pytest.fixture(scope="module")
def database_url(postgres: PostgresServer) -> str:
    """A fresh database on the module's PostgreSQL server, for the module's tests."""
    return postgres.new_database()


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp_path = tmp_path_factory.mktemp("redis")
    port = free_port()
    proc = subprocess.Popen(
        [require_tool("redis-server"), "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_for_port(port, 120, proc)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        stop_process(proc)
