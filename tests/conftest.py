"""Fixtures shared by every test folder. Plain helpers are in tests/support.py (and the
product's own: zerogap.net, zerogap.process_group); tests import nothing from here."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.backends.vllm.pool import Pool, start_pool, stop_pool_checked
from zerogap.net import free_port


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Files with a slow test first (order kept otherwise): pytest-xdist hands out whole files
    in this order, so the longest start at once instead of ending the run on one worker."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)


@pytest.fixture
def port() -> int:
    return free_port()


@pytest.fixture
def clean_env() -> Iterator[dict[str, str]]:
    """An environment for child processes without the developer's TAOTOKEN_API_KEY."""
    env = {k: v for k, v in os.environ.items() if k != "TAOTOKEN_API_KEY"}
    yield env


@pytest.fixture(scope="session")
def vllm_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    """One real vLLM replica (the tiny model) and a real gateway for the whole vLLM tier: each vLLM
    start costs a minute or more on two cores. A test may kill the replica (the launcher restarts
    it) but must leave the pool serving. When the tier ends, its stop is checked: SIGTERM ends
    `zerogap backends up` with 0 and no process of the replica outlives it."""
    pool = start_pool(tmp_path_factory.mktemp("vllm-pool"))
    try:
        yield pool
    finally:
        stop_pool_checked(pool)
