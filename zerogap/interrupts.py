"""Ctrl-C and SIGTERM for the commands that start a stack and run a load test in the main
thread (`zerogap demo`, `zerogap tune`): both raise KeyboardInterrupt, whatever the command
inherited, and a child's start can hold them until the child exists."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_deferred: list[int] = []


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def stop_on_signals() -> None:
    """SIGINT and SIGTERM raise KeyboardInterrupt in the main thread. Set, not inherited: a
    command started with SIGINT ignored (a non-interactive shell's `cmd &`) still stops on
    Ctrl-C, as `zerogap gateway` and `backends up` do (uvicorn and the supervisor set theirs)."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, _raise_interrupt)


def _defer(signum: int, frame: object) -> None:
    _deferred.append(signum)


@contextlib.contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Hold Ctrl-C / SIGTERM while a child starts; `raise_if_deferred` delivers them."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be set from the main thread
        return
    previous = {sig: signal.signal(sig, _defer) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def raise_if_deferred() -> None:
    if _deferred:
        _deferred.clear()
        raise KeyboardInterrupt
