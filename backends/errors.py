"""Errors shared by every kind of backend pool (vLLM replicas and sims)."""

from __future__ import annotations


class LaunchError(Exception):
    """A pool that cannot be started as configured; str() says what to do."""
