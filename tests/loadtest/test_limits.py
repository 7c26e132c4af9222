"""The open-files limit is raised to the hard limit, with a warning when that is too low."""

from __future__ import annotations

import logging
import resource

import pytest

from loadgen.open_files import raise_open_files


def test_raises_to_the_hard_limit_and_warns_when_that_is_short(caplog: pytest.LogCaptureFixture) -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with caplog.at_level(logging.INFO, logger="zerogap.loadtest"):
        soft = raise_open_files(needed=64)
    assert soft == (hard if hard != resource.RLIM_INFINITY else soft)
    assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == soft
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    with caplog.at_level(logging.WARNING, logger="zerogap.loadtest"):
        raise_open_files(needed=soft + 1)
    assert f"ulimit -n {soft + 1}" in caplog.text
