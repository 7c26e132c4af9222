"""Fixtures shared by every test folder. Plain helpers are in tests/support.py (and the
product's own: common.net, common.process_group); tests import nothing from here."""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator

import pytest

from common.net import free_port
from tests.backends.vllm.pool import Pool, launch_pool, stop_pool_checked, until_ready

POOL_LAUNCHED = pytest.StashKey[bool]()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests that do not use the vLLM tier's shared replica before those that do, which start it
    (vllm_pool): nothing of it starts or runs beside the tier's timed comparisons, which use none of
    it. Within each, files with a slow test first (order kept otherwise): pytest-xdist hands out
    whole files in this order, so the longest start at once instead of ending the run on one worker."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: ("vllm_pool" in getattr(item, "fixturenames", ()), item.path not in slow_files))


def pytest_collection_finish(session: pytest.Session) -> None:
    """What the imports made is kept for good (gc.freeze), so that the collection after each test
    (below) reads only what tests made since: ~0.2 ms instead of ~200 ms on the busy 2-core machine."""
    gc.collect()
    gc.freeze()


@pytest.fixture(autouse=True)
def _leaks_fail_their_test() -> Iterator[None]:
    """A transport, socket or file a test left open is collected as its fixtures end (this one is
    set up first, so it ends last: after the test's event loop closed), before pytest reads the
    warnings of its teardown: the ResourceWarning fails the test that leaked, not the one that
    happens to run when the collector next comes by."""
    yield
    gc.collect()


@pytest.fixture
def port() -> int:
    return free_port()


@pytest.fixture
def clean_env() -> Iterator[dict[str, str]]:
    """An environment for child processes without the developer's TAOTOKEN_API_KEY."""
    env = {k: v for k, v in os.environ.items() if k != "TAOTOKEN_API_KEY"}
    yield env


@pytest.fixture(scope="session")
def vllm_pool(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    """One real vLLM replica (the tiny model) and a real gateway for the whole vLLM tier: each vLLM
    start costs a minute or more on two cores. Started by the first test that uses it, after every
    test that does not (pytest_collection_modifyitems). A test may kill the replica (the launcher
    restarts it) but must leave the pool serving. When the tier ends, its stop is checked: SIGTERM
    ends `zerogap backends up` with 0 and no process of the replica outlives it."""
    request.session.stash[POOL_LAUNCHED] = True
    pool = launch_pool(tmp_path_factory.mktemp("vllm-pool"))
    try:
        yield until_ready(pool)
    finally:
        stop_pool_checked(pool)


@pytest.fixture
def nothing_beside(request: pytest.FixtureRequest) -> None:
    """For a timed comparison: the tier's shared replica has not been started (once started it runs,
    and vLLM's CPU engine busy-polls a core, until the session ends)."""
    assert not request.session.stash.get(POOL_LAUNCHED, False), (
        "the vLLM tier's shared replica was started before this timed comparison and runs beside it: "
        "run it before any test that uses vllm_pool (tests/conftest.py orders them so)"
    )
