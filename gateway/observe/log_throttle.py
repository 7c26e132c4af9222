"""Log lines a client can cause with each request are logged at most once per interval per kind,
with a count, so that a flood of bad requests cannot flood the log (nor fill its disk):

    WARNING uvicorn.error: Invalid HTTP request received.
    WARNING uvicorn.error: Invalid HTTP request received. [999 more like this in the last 60 s]

The first line of a kind (its logger, level and message template) is logged at once; the next
ones are counted, not logged, until the interval ends (`flush`, every INTERVAL_S while the
gateway runs, and when it stops): then one line says how many there were, with the last one's
text. An interval with none ends the kind's quiet period: its next line is logged at once again.

The lines it holds back (CLIENT_CAUSED): uvicorn's warnings about a request (a malformed request
line or header, an unsupported Upgrade), the HTTP limits' refusals (gateway/server/http_limits.py: 431,
408, too many connections), failed-auth throttling's block of an address
(gateway/tenants/auth_throttle.py) and a keep-alive comment that a leaving client did not take
(gateway/relay/client_side.py). Lines about the gateway's own state (a backend, the key store) are
never held back. Per process (each worker of --workers N counts its own)."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

INTERVAL_S = 60.0
SUMMARY = "_zerogap_throttle_summary"  # a record attribute: the summary line itself, never held back

Rule = Callable[[logging.LogRecord], bool]

CLIENT_CAUSED: dict[str, Rule] = {
    "uvicorn.error": lambda r: r.levelno >= logging.WARNING,
    "zerogap.gateway.http": lambda r: True,
    "zerogap.gateway.auth": lambda r: r.levelno >= logging.WARNING and str(r.msg).startswith("client %s:"),
    "zerogap.gateway.client_side": lambda r: r.levelno >= logging.WARNING,
}


@dataclass
class _Held:
    level: int
    num: int = 0  # held back since the last flush
    last: str = ""  # the last held-back line's text


class LogThrottle(logging.Filter):
    """A filter on the loggers of CLIENT_CAUSED; `flush` writes the counts and ends quiet kinds."""

    def __init__(self, interval_s: float = INTERVAL_S, rules: dict[str, Rule] | None = None) -> None:
        super().__init__()
        self.interval_s = interval_s
        self.rules = CLIENT_CAUSED if rules is None else rules
        self._held: dict[tuple[str, int, str], _Held] = {}
        self._lock = threading.Lock()  # a record may come from any thread
        self._since_s = time.monotonic()

    def filter(self, record: logging.LogRecord) -> bool:
        rule = self.rules.get(record.name)
        if rule is None or getattr(record, SUMMARY, False) or not rule(record):
            return True
        kind = (record.name, record.levelno, str(record.msg))
        with self._lock:
            held = self._held.get(kind)
            if held is None:  # the first of its kind this interval: logged
                self._held[kind] = _Held(record.levelno)
                return True
            held.num += 1
            held.last = record.getMessage()
        return False

    def flush(self) -> None:
        """One line per kind held back since the last flush; kinds with none held start over."""
        now_s = time.monotonic()
        with self._lock:
            span_s, self._since_s = now_s - self._since_s, now_s
            lines = [(name, h) for (name, _, _), h in self._held.items() if h.num]
            self._held = {kind: _Held(h.level) for kind, h in self._held.items() if h.num}
        for name, held in lines:
            logging.getLogger(name).log(
                held.level, "%s [%d more like this in the last %.0f s]", held.last, held.num, span_s,
                extra={SUMMARY: True},
            )  # fmt: skip

    async def flush_forever(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            self.flush()

    def install(self) -> None:
        for name in self.rules:
            logger = logging.getLogger(name)
            if self not in logger.filters:
                logger.addFilter(self)

    def uninstall(self) -> None:
        for name in self.rules:
            logging.getLogger(name).removeFilter(self)
