"""Fixtures shared by every test folder. Plain helpers are in tests/support.py (and the
product's own: zerogap.net, backends.process_group); tests import nothing from here."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from zerogap.net import free_port


@pytest.fixture
def port() -> int:
    return free_port()


@pytest.fixture
def clean_env() -> Iterator[dict[str, str]]:
    """An environment for child processes without the developer's TAOTOKEN_API_KEY."""
    env = {k: v for k, v in os.environ.items() if k != "TAOTOKEN_API_KEY"}
    yield env
