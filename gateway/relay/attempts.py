"""What an attempt at a backend can come to before its first byte, in the words a client may read
(`AttemptFailed`), and the labels the relay sorts answers by. The relay (gateway/relay/relay.py) raises
and catches these; it tries another backend unless the failure says not to."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from gateway.upstream.client import UpstreamError

if TYPE_CHECKING:
    from gateway.pool.flights import Flight
    from gateway.pool.model_pool import Backend
    from gateway.relay.pipe import Pipe

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
CREDENTIAL_STATUSES = frozenset({401, 403})  # the backend refused the gateway's api_key: not the client's to fix
OUTLIER_LABELS = frozenset({"connect", "broken", "500", "502", "503", "504"})  # failures that count toward ejection
_FINISH_REASON = re.compile(rb'"finish_reason"\s*:\s*"([a-z_]{1,32})"')


class AttemptFailed(Exception):
    """One attempt at a backend failed before the first byte, and what the client gets if it is the
    last: another backend is tried unless `retryable` is False (the gateway is shutting down).
    `message` goes to the client: it names the backend and the kind of failure, never an address,
    an errno or the backend's body, which go to the log (`detail`)."""

    def __init__(self, status: int, label: str, message: str, retryable: bool = True, detail: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.label = label
        self.message = message
        self.retryable = retryable
        self.detail = detail  # for the log only


def stopped(backend: Backend, flight: Flight) -> AttemptFailed:
    """The backend left the pool (ejected), or the gateway drains, before it answered."""
    if flight.stop == "draining":
        message = "The gateway is shutting down ([gateway].drain_timeout_s passed); send the request again."
        return AttemptFailed(503, "draining", message, retryable=False)
    return AttemptFailed(502, "ejected", f"Backend {backend.name} left the pool before it answered.")


def no_first_byte(flight: Flight, pipe: Pipe, error: BaseException | None, timeout_s: float) -> AttemptFailed:
    """Why a stream ended before its first byte (whatever came was no whole event)."""
    name = flight.backend.name
    if pipe.first_byte is not None and pipe.first_byte.expired:
        if flight.stop is not None:
            return stopped(flight.backend, flight)
        message = f"Backend {name} sent nothing within {timeout_s} s ([gateway].first_byte_timeout_s)."
        return AttemptFailed(504, "first_byte_timeout", message)
    if isinstance(error, UpstreamError):
        return AttemptFailed(502, error.reason, f"Backend {name} {error.failure}.", detail=error.detail)
    return AttemptFailed(502, "empty", f"Backend {name} closed the stream before sending anything.")


def finish_reasons(body: bytes) -> list[str]:
    """The finish reasons of a whole answer, without decoding it again (traced requests only)."""
    return [m.decode() for m in _FINISH_REASON.findall(body)]
