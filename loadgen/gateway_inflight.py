"""The zerogap gateway's own in-flight figure on the timeline: `zerogap_backend_inflight` (summed over
its backends) from GET /metrics at the root of the run's base URL, with the metrics key that
metrics.gateway_metrics_key_env names. It tells the two places a request can wait before the engine
apart: held in zerogap's gateway (users minus this) or held in the engine's own API server (this minus
the engines' running + waiting); the diagnosis reads it (loadreport/diagnosis.py, `gateway`/`frontend`).

Asked at the first sample: a target whose /metrics has no such gauge (an engine, another proxy) or
refuses the key is not asked again, and the figure stays None; a zerogap gateway that fails one
sample later gives None for that sample only."""

from __future__ import annotations

import logging
import os
import urllib.error
import urllib.parse
from collections.abc import Mapping

from common.promtext import sums_by_name
from loadgen.metrics_discovery import fetch_with_key

INFLIGHT = "zerogap_backend_inflight"
log = logging.getLogger("zerogap.loadtest")


def gateway_metrics_url(base_url: str) -> str:
    """GET /metrics at the root of base_url's host ('http://h:8000/api' -> 'http://h:8000/metrics')."""
    parts = urllib.parse.urlsplit(base_url)
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, "/metrics", "", ""))


class GatewayInflight:
    """One figure per call: the requests the gateway at base_url has in flight at the engines."""

    def __init__(
        self, base_url: str | None, key_env: str, timeout_s: float, env: Mapping[str, str] | None = None
    ) -> None:
        self.url = gateway_metrics_url(base_url) if base_url else None
        self.key = (os.environ if env is None else env).get(key_env, "") if key_env else ""
        self.key_env = key_env
        self.timeout_s = timeout_s
        self.known = False  # whether a sample has shown the gauge: a gateway, asked on every sample

    def sample(self) -> float | None:
        if self.url is None:
            return None
        try:
            page = fetch_with_key(self.url, self.key, self.timeout_s).decode("utf-8", "replace")
        except urllib.error.HTTPError as exc:
            self._give_up(f"GET {self.url} answered {exc.code}")
            return None
        except (OSError, ValueError) as exc:
            self._give_up(f"GET {self.url} failed ({exc})")
            return None
        value = sums_by_name(page, {INFLIGHT}).get(INFLIGHT)
        if value is None:
            self._give_up("")
            return None
        self.known = True
        return value

    def _give_up(self, why: str) -> None:
        """Not asked again, unless a sample has shown the gauge (then this sample only is lost)."""
        if self.known:
            return
        if why:
            held = f"the key in {self.key_env}" if self.key else f"no key ({self.key_env} unset)"
            log.info("zerogap: no gateway in-flight figure (%s with %s)", why, held)
        self.url = None
