"""Fixtures shared by every test folder. Plain helpers are in tests/support.py (and the
product's own: zerogap.net, zerogap.process_group); tests import nothing from here."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.backends.vllm.pool import Pool, launch_pool, stop_pool_checked, until_ready
from zerogap.net import free_port


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Files with a slow test first (order kept otherwise): pytest-xdist hands out whole files
    in this order, so the longest start at once instead of ending the run on one worker. Tests
    that do not use the vLLM tier's shared replica come before those that do: one of them starts
    the replica while it runs (vllm_pool_launched)."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: (item.path not in slow_files, "vllm_pool" in getattr(item, "fixturenames", ())))


@pytest.fixture
def port() -> int:
    return free_port()


@pytest.fixture
def clean_env() -> Iterator[dict[str, str]]:
    """An environment for child processes without the developer's TAOTOKEN_API_KEY."""
    env = {k: v for k, v in os.environ.items() if k != "TAOTOKEN_API_KEY"}
    yield env


@pytest.fixture(scope="session")
def vllm_pool_launched(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    """The vLLM tier's one replica, launched and not waited for: a long test that needs no replica
    of it (the real-vLLM tune, which held beside two busy loops) asks for it (vllm_pool_ahead), and
    the replica's minute-long start runs beside it. When the tier ends, its stop is checked:
    SIGTERM ends `zerogap backends up` with 0 and no process of the replica outlives it."""
    pool = launch_pool(tmp_path_factory.mktemp("vllm-pool"))
    try:
        yield pool
    finally:
        stop_pool_checked(pool)


@pytest.fixture
def vllm_pool_ahead(request: pytest.FixtureRequest) -> None:
    """Launches the tier's shared replica now if a later test of the session will use it."""
    if any("vllm_pool" in getattr(item, "fixturenames", ()) for item in request.session.items):
        request.getfixturevalue("vllm_pool_launched")


@pytest.fixture(scope="session")
def vllm_pool(vllm_pool_launched: Pool) -> Pool:
    """One real vLLM replica (the tiny model) and a real gateway for the whole vLLM tier: each vLLM
    start costs a minute or more on two cores. A test may kill the replica (the launcher restarts
    it) but must leave the pool serving."""
    return until_ready(vllm_pool_launched)
