"""The backends' /metrics URLs when settings.json does not list them: a zerogap gateway knows
its pool and lists it at GET /metrics/backends (gateway/endpoints/backends_info.py), guarded as its GET
/metrics is, by [server].metrics_key, which the harness reads from the environment variable
metrics.gateway_metrics_key_env names (ZEROGAP_METRICS_KEY; unset: asked without a key).

metrics.backend_metrics_urls absent: asked of the gateway at api.base_url's host; a list:
used as it is; [] : no backend signals. A target that is no zerogap gateway (404), refuses
the key (401) or cannot be reached leaves the list empty, with a line that says what to set."""

from __future__ import annotations

import ipaddress
import json
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass

import gevent

from loadreport.settings import MetricsSection

PATH = "/metrics/backends"
EMPTY = "metrics.backend_metrics_urls is empty"
LOOPBACK_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost"}


@dataclass(frozen=True)
class MetricsUrls:
    urls: list[str]
    note: str  # where they came from, or why there are none (for the log and for gpu_util_reason)
    asked: bool = False  # whether the gateway was asked (the note is then worth a log line)
    passing: bool = False  # the gateway did not answer in time, or answered 5xx: worth asking again


def listing_url(base_url: str) -> str:
    """GET /metrics/backends at the root of base_url's host ('http://h:8000/api' -> 'http://h:8000/metrics/backends')."""
    parts = urllib.parse.urlsplit(base_url)
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, PATH, "", ""))


def _is_loopback(host: str) -> bool:
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return address.is_loopback or address.is_unspecified


def as_seen_from_here(metrics_url: str, gateway_host: str) -> str:
    """A backend the gateway reaches on its own loopback is on the gateway's host: from here, that host."""
    parts = urllib.parse.urlsplit(metrics_url)
    if not parts.hostname or not _is_loopback(parts.hostname) or _is_loopback(gateway_host):
        return metrics_url
    host = f"[{gateway_host}]" if ":" in gateway_host else gateway_host
    netloc = f"{host}:{parts.port}" if parts.port is not None else host
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, parts.query, ""))


def _set_it(why: str) -> str:
    return (
        f"{why}; no backend signals (GPU utilization, running, waiting, KV cache). Set metrics.backend_metrics_urls"
        ' to the engines\' /metrics URLs, e.g. ["http://10.0.0.5:8000/metrics"] ([] to stop asking)'
    )


def fetch_with_key(url: str, key: str, timeout_s: float) -> bytes:
    """GET url with the metrics key (if any) as a Bearer token, the whole answer within timeout_s."""
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
    with gevent.Timeout(timeout_s, TimeoutError(f"no complete answer within {timeout_s:g} s")):
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            data: bytes = response.read()
            return data


def _listed(body: bytes) -> list[str]:
    data = json.loads(body)["data"]
    if any(entry["metrics_url"] is None for entry in data):  # a gateway without a metrics_key, asked from elsewhere
        raise ValueError(
            "it lists its backends without their addresses: it shows them only to its [server].metrics_key or to "
            "a client on its own host. Set metrics_key there and export it here as ZEROGAP_METRICS_KEY"
        )
    urls = [str(entry["metrics_url"]) for entry in data]
    if not all(url.startswith(("http://", "https://")) for url in urls):
        raise ValueError("a metrics_url is not an http(s) URL")
    return urls


def ask_gateway(base_url: str, key_env: str, timeout_s: float, env: Mapping[str, str] | None = None) -> MetricsUrls:
    """The backends' metrics URLs from the zerogap gateway at base_url's host."""
    url = listing_url(base_url)
    key = (os.environ if env is None else env).get(key_env, "") if key_env else ""
    try:
        urls = _listed(fetch_with_key(url, key, timeout_s))
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return MetricsUrls([], _set_it(f"GET {url} answered 404: {base_url} is not a zerogap gateway"), True)
        if exc.code in (401, 403):
            held = f"the key in {key_env}" if key else f"no key ({key_env or 'metrics.gateway_metrics_key_env'} unset)"
            why = f"GET {url} answered {exc.code} to {held}: export {key_env or 'ZEROGAP_METRICS_KEY'}=<the gateway's"
            return MetricsUrls([], _set_it(f"{why} [server].metrics_key>"), True)
        return MetricsUrls([], _set_it(f"GET {url} answered HTTP {exc.code}"), True, exc.code >= 500)
    except OSError as exc:  # refused, timed out: a gateway still starting, or a busy one
        return MetricsUrls([], _set_it(f"GET {url} failed ({exc})"), True, True)
    except (ValueError, KeyError, TypeError) as exc:  # not the listing's JSON
        return MetricsUrls([], _set_it(f"GET {url} failed ({exc})"), True)
    gateway_host = urllib.parse.urlsplit(base_url).hostname or ""
    urls = [as_seen_from_here(metrics_url, gateway_host) for metrics_url in urls]
    if not urls:
        return MetricsUrls([], _set_it(f"the gateway at {url} lists no backends"), True)
    return MetricsUrls(urls, f"backend metrics from the gateway ({url}): {', '.join(urls)}", True)


def metrics_urls(metrics: MetricsSection, gateway_url: str | None, env: Mapping[str, str] | None = None) -> MetricsUrls:
    """The URLs the sampler scrapes: settings.json's list, else the gateway's (gateway_url: the run's base URL)."""
    if metrics.backend_metrics_urls is not None:
        listed = metrics.backend_metrics_urls
        return MetricsUrls(listed, "" if listed else EMPTY)
    if not gateway_url:
        return MetricsUrls([], _set_it("metrics.backend_metrics_urls is absent and there is no gateway to ask"))
    return ask_gateway(gateway_url, metrics.gateway_metrics_key_env, metrics.scrape_timeout_seconds, env)
