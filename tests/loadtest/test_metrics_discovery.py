"""metrics.backend_metrics_urls absent: the harness asks the zerogap gateway at api.base_url
(GET /metrics/backends, with the metrics key from metrics.gateway_metrics_key_env) and samples
the backends it lists; a list is used as it is, [] means none; a target that is no zerogap gateway
leaves none, with a line saying what to set. Real gateway and upstream servers on loopback."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from common.net import free_port
from loadgen.metrics_discovery import EMPTY, as_seen_from_here, ask_gateway, listing_url, metrics_urls
from loadgen.sampler import DISCOVERY_TRIES, Sampler
from loadreport.settings import MetricsSection, parse_settings
from tests.fixtures.upstream import Behavior, UpstreamServer
from tests.gateway.helpers import GatewayServer, make_config
from tests.support import QuietHandler, serving

METRICS_KEY = "metrics-discovery-key-31"
KEY_ENV = "ZG_TEST_GATEWAY_METRICS_KEY"


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[GatewayServer, UpstreamServer]]:
    """A gateway with [server].metrics_key over one backend that reports 3 running, 2 waiting."""
    with UpstreamServer(Behavior(extra_running=3, extra_waiting=2), model="m") as up:
        config = make_config(tmp_path_factory.mktemp("discovery"), [("b0", up.url, "m")])
        config = config.model_copy(update={"server": config.server.model_copy(update={"metrics_key": METRICS_KEY})})
        with GatewayServer(config) as gs:
            yield gs, up


def test_absent_means_ask_an_empty_list_means_none_a_list_is_kept() -> None:
    assert parse_settings("{}").metrics.backend_metrics_urls is None
    assert parse_settings("{}").metrics.gateway_metrics_key_env == "ZEROGAP_METRICS_KEY"
    assert parse_settings('{"metrics": {"backend_metrics_urls": []}}').metrics.backend_metrics_urls == []
    dead = f"http://127.0.0.1:{free_port()}/api"  # asking it would fail: nothing is asked
    listed = MetricsSection(backend_metrics_urls=["http://10.1.2.3:8000/metrics"])
    assert metrics_urls(listed, dead).urls == ["http://10.1.2.3:8000/metrics"] and not metrics_urls(listed, dead).asked
    none = metrics_urls(MetricsSection(backend_metrics_urls=[]), dead)
    assert none.urls == [] and none.note == EMPTY and not none.asked
    assert listing_url("https://gw.example:8443/api/") == "https://gw.example:8443/metrics/backends"


def test_the_gateway_lists_its_backends_for_its_metrics_key(pool: tuple[GatewayServer, UpstreamServer]) -> None:
    gs, up = pool
    found = ask_gateway(gs.url + "/api", KEY_ENV, 5.0, env={KEY_ENV: METRICS_KEY})
    assert found.urls == [up.url + "/metrics"] and found.asked
    assert found.note == f"backend metrics from the gateway ({gs.url}/metrics/backends): {up.url}/metrics"
    refused = ask_gateway(gs.url + "/api", KEY_ENV, 5.0, env={})
    assert refused.urls == [] and "answered 401 to no key" in refused.note
    assert f"export {KEY_ENV}=<the gateway's [server].metrics_key>" in refused.note
    assert "metrics.backend_metrics_urls" in refused.note
    wrong = ask_gateway(gs.url + "/api", KEY_ENV, 5.0, env={KEY_ENV: "not-the-metrics-key-at-all"})
    assert wrong.urls == [] and f"answered 401 to the key in {KEY_ENV}" in wrong.note
    assert METRICS_KEY not in wrong.note + found.note and "not-the-metrics-key" not in wrong.note


def test_a_target_that_is_no_zerogap_gateway_says_how_to_list_the_backends() -> None:
    with UpstreamServer(model="m") as up:  # an engine, not a gateway: 404
        found = ask_gateway(up.url + "/v1", "ZEROGAP_METRICS_KEY", 5.0, env={})
    assert found.urls == [] and found.asked
    assert f"GET {up.url}/metrics/backends answered 404: {up.url}/v1 is not a zerogap gateway" in found.note
    assert "Set metrics.backend_metrics_urls to the engines' /metrics URLs, e.g. [\"http://" in found.note
    gone = ask_gateway(f"http://127.0.0.1:{free_port()}", "ZEROGAP_METRICS_KEY", 5.0, env={})
    assert gone.urls == [] and "failed (" in gone.note and "Set metrics.backend_metrics_urls" in gone.note


def test_a_backend_on_the_gateways_loopback_is_reached_at_the_gateways_host() -> None:
    assert as_seen_from_here("http://127.0.0.1:8100/metrics", "gw.example") == "http://gw.example:8100/metrics"
    assert as_seen_from_here("http://localhost:8100/metrics", "10.0.0.9") == "http://10.0.0.9:8100/metrics"
    assert as_seen_from_here("http://0.0.0.0:8100/metrics", "fd00::9") == "http://[fd00::9]:8100/metrics"
    assert as_seen_from_here("http://127.0.0.1:8100/metrics", "127.0.0.1") == "http://127.0.0.1:8100/metrics"
    assert as_seen_from_here("http://10.0.0.5:8100/metrics", "gw.example") == "http://10.0.0.5:8100/metrics"


def test_the_sampler_reads_the_backends_the_gateway_lists(
    pool: tuple[GatewayServer, UpstreamServer], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    gs, up = pool
    monkeypatch.setenv("ZEROGAP_METRICS_KEY", METRICS_KEY)
    caplog.set_level(logging.INFO, logger="zerogap.loadtest")
    sampler = Sampler(MetricsSection(), gs.url + "/api")
    samples = [sampler.sample(users=5), sampler.sample(users=5)]
    assert [(s.running, s.waiting) for s in samples] == [(3.0, 2.0), (3.0, 2.0)]
    assert sampler.urls == [up.url + "/metrics"]
    said = [r.getMessage() for r in caplog.records if "backend metrics from the gateway" in r.getMessage()]
    assert said == [f"zerogap: backend metrics from the gateway ({gs.url}/metrics/backends): {up.url}/metrics"]


def test_the_sampler_without_backends_says_why_in_the_gpu_reason(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="zerogap.loadtest")
    with UpstreamServer(model="m") as up:
        sampler = Sampler(MetricsSection(), up.url)
        first, second = sampler.sample(users=1), sampler.sample(users=1)
    assert first.gpu_util is None and first.running is None
    assert (
        "is not a zerogap gateway" in first.gpu_util_reason and "metrics.backend_metrics_urls" in first.gpu_util_reason
    )
    assert second.gpu_util_reason == first.gpu_util_reason
    warned = [r for r in caplog.records if "not a zerogap gateway" in r.getMessage()]
    assert len(warned) == 1 and warned[0].levelno == logging.WARNING  # asked once, said once
    listed_none = Sampler(MetricsSection(backend_metrics_urls=[]), up.url).sample(users=1)
    assert listed_none.gpu_util_reason == EMPTY


def test_the_readme_gives_the_default_the_code_has() -> None:
    """loadtest/README.md's settings table: backend_metrics_urls absent means asked of the gateway (no fixed URL)."""
    default = MetricsSection().backend_metrics_urls
    assert default is None
    readme = (Path(__file__).resolve().parents[2] / "loadtest" / "README.md").read_text(encoding="utf-8")
    row = next(line for line in readme.splitlines() if line.startswith("| `metrics.backend_metrics_urls`"))
    assert "/metrics/backends" in row and "8100" not in row, row


@contextmanager
def slow_listing(metrics_url: str, num_slow: int, delay_s: float) -> Iterator[tuple[str, list[float]]]:
    """A stand-in for the gateway's GET /metrics/backends (the real one: the tests above) that
    answers its first num_slow requests delay_s late; yields its URL and when each request came."""
    arrivals: list[float] = []
    body = json.dumps({"data": [{"name": "b0", "model": "m", "url": "", "metrics_url": metrics_url, "up": True}]})

    class Handler(QuietHandler):
        def do_GET(self) -> None:
            if self.path != "/metrics/backends":  # the sampler's read of the gateway's own gauge
                self.send_error(404)
                return
            arrivals.append(time.monotonic())
            if len(arrivals) <= num_slow:
                time.sleep(delay_s)
            self.reply(200, body.encode(), "application/json")

    with serving(Handler) as url:
        yield url, arrivals


def test_a_gateway_slow_to_list_its_backends_is_asked_again(caplog: pytest.LogCaptureFixture) -> None:
    """One answer later than the scrape timeout (a busy machine at the run's start) must not cost
    the whole run its engine figures: the next sample asks again."""
    caplog.set_level(logging.INFO, logger="zerogap.loadtest")
    with UpstreamServer(Behavior(extra_running=3, extra_waiting=2), model="m") as up:
        with slow_listing(up.url + "/metrics", num_slow=1, delay_s=1.0) as (url, arrivals):
            sampler = Sampler(MetricsSection(scrape_timeout_seconds=0.3), url + "/api")
            first, second, third = (sampler.sample(users=5) for _ in range(3))
    assert first.running is None and (second.running, second.waiting) == (3.0, 2.0) == (third.running, third.waiting)
    assert len(arrivals) == 2 and sampler.urls == [up.url + "/metrics"]  # found: not asked again
    said = [r.getMessage() for r in caplog.records]
    assert any("failed (" in m and m.endswith("; asking again at the next sample") for m in said), said


def test_a_gateway_that_never_answers_in_time_is_asked_a_bounded_number_of_times(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with slow_listing("http://127.0.0.1:9/metrics", num_slow=10**6, delay_s=0.5) as (url, arrivals):
        sampler = Sampler(MetricsSection(scrape_timeout_seconds=0.1), url + "/api")
        samples = [sampler.sample(users=1) for _ in range(DISCOVERY_TRIES + 3)]
    assert len(arrivals) == DISCOVERY_TRIES and sampler.urls == []
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 2 and warned[-1].endswith(f"; asked {DISCOVERY_TRIES} times, not asked again"), warned
    assert all(s.running is None for s in samples) and "failed (" in samples[-1].gpu_util_reason
