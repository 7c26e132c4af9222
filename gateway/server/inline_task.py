"""A coroutine run as a task from the callback that starts it, with no loop hop before its first wait.

`loop.create_task(coro)` schedules the coroutine's first step with `call_soon`: the request that a
parser callback has just completed waits in the loop's ready queue behind every other callback of
that iteration (at 256 streams, ~50 µs on this machine, bench/PERF_NOTES.md) before a line of the
endpoint runs, and the upstream write comes after it. Python 3.11 has no eager tasks (3.12's
`eager_start`), and its C Task cannot be stepped by hand, so `InlineTask` is a small task of its
own: `start()` steps the coroutine at once, in the caller's callback, up to its first real wait
(on the completion path: the backend's response head, the request already written upstream); each
later step runs from the done callback of the future it waited for, as a Task's does.

While a step runs the driver is the loop's current task (`asyncio.current_task()`), so that
`asyncio.timeout` and the code that cancels "its own task" (the relay's client side) work as in
a Task: `cancel()` cancels the future it waits for (or throws CancelledError into its next step),
`cancelling()` and `uncancel()` count the requests, as asyncio.Task's do. It is enough of a Task
for uvicorn's server (its `tasks` set: `add_done_callback`, `cancel` at the graceful timeout,
`done`). Used only for the completion endpoints on the gateway's own protocol
(gateway/server/http_limits.py); everything else runs in ordinary tasks.
"""

from __future__ import annotations

import asyncio
import logging
from asyncio import tasks as _tasks
from collections.abc import Callable, Coroutine
from typing import Any

log = logging.getLogger("zerogap.gateway.inline_task")

_enter_task = _tasks._enter_task
_leave_task = _tasks._leave_task


class InlineTask:
    """Drives one coroutine (a request's `run_asgi`) as a task would, its first step inline."""

    __slots__ = ("_callbacks", "_coro", "_done", "_exception", "_loop", "_must_cancel", "_num_cancels", "_waiter")

    def __init__(self, coro: Coroutine[Any, Any, None], loop: asyncio.AbstractEventLoop) -> None:
        self._coro = coro
        self._loop = loop
        self._waiter: asyncio.Future[Any] | None = None  # the future its coroutine waits for
        self._must_cancel = False  # cancel() came while no future could take it: the next step throws
        self._num_cancels = 0
        self._done = False
        self._exception: BaseException | None = None
        self._callbacks: list[Callable[[Any], object]] = []

    def start(self) -> None:
        """The first step, now, in the caller's callback (which must not run inside a task)."""
        self._step(None, None)

    # the parts of asyncio.Task that the gateway, asyncio.timeout and uvicorn use
    def get_loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def done(self) -> bool:
        return self._done

    def cancelled(self) -> bool:
        return self._done and isinstance(self._exception, asyncio.CancelledError)

    def exception(self) -> BaseException | None:
        return self._exception

    def cancelling(self) -> int:
        return self._num_cancels

    def uncancel(self) -> int:
        if self._num_cancels > 0:
            self._num_cancels -= 1
        return self._num_cancels

    def cancel(self, msg: Any = None) -> bool:
        if self._done:
            return False
        self._num_cancels += 1
        waiter = self._waiter
        if waiter is not None and waiter.cancel(msg=msg):
            return True  # its done callback wakes the coroutine with CancelledError
        self._must_cancel = True
        return True

    def add_done_callback(self, callback: Callable[[Any], object]) -> None:
        if self._done:
            self._loop.call_soon(callback, self)
        else:
            self._callbacks.append(callback)

    def remove_done_callback(self, callback: Callable[[Any], object]) -> int:
        before = len(self._callbacks)
        self._callbacks = [c for c in self._callbacks if c != callback]
        return before - len(self._callbacks)

    # driving
    def _step(self, value: Any, exc: BaseException | None) -> None:
        loop = self._loop
        try:
            _enter_task(loop, self)  # type: ignore[arg-type]  # a task in all that asyncio reads of one
        except RuntimeError:  # started inside another task (not from a protocol's callback): next iteration
            loop.call_soon(self._step, value, exc)
            return
        if self._must_cancel:
            self._must_cancel = False
            exc = asyncio.CancelledError()
        try:
            result = self._coro.send(value) if exc is None else self._coro.throw(exc)
        except StopIteration:
            self._finish(None)
        except BaseException as error:  # CancelledError included: the task ends cancelled
            self._finish(error)
            if isinstance(error, KeyboardInterrupt | SystemExit):
                raise
        else:
            self._wait(result)
        finally:
            _leave_task(loop, self)  # type: ignore[arg-type]

    def _wait(self, result: Any) -> None:
        if result is None:  # a bare yield (asyncio.sleep(0)): the next step in the next iteration
            self._loop.call_soon(self._step, None, None)
            return
        if getattr(result, "_asyncio_future_blocking", None) is None:
            self._loop.call_soon(self._step, None, RuntimeError(f"Task got bad yield: {result!r}"))
            return
        result._asyncio_future_blocking = False
        self._waiter = result
        result.add_done_callback(self._wakeup)
        if self._must_cancel and result.cancel():
            self._must_cancel = False

    def _wakeup(self, future: asyncio.Future[Any]) -> None:
        self._waiter = None
        try:
            value = future.result()
        except BaseException as exc:
            self._step(None, exc)
        else:
            self._step(value, None)

    def _finish(self, exception: BaseException | None) -> None:
        self._done = True
        self._exception = exception
        if exception is not None and not isinstance(exception, asyncio.CancelledError):
            log.error("a request's task failed", exc_info=exception)
        self._coro = None  # type: ignore[assignment]
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            self._loop.call_soon(callback, self)


def inline_paths(app: Any) -> frozenset[str]:
    """The paths that `app` (the gateway's middleware chain, as uvicorn holds it) serves with an
    endpoint marked `inline = True` (the completion endpoints, gateway/endpoints/completions.py)."""
    for _ in range(8):  # uvicorn's wrappers (proxy headers), then the gateway's ErrorShield, FastPath
        routes = getattr(app, "routes", None)
        if isinstance(routes, dict):
            return frozenset(path for path, endpoint in routes.items() if getattr(endpoint, "inline", False))
        app = getattr(app, "app", None)
        if app is None:
            break
    return frozenset()
