"""gateway/pool/model_pool.py: the backend each policy chooses, and panic routing."""

from __future__ import annotations

from common.config.gateway import BackendEntry
from common.config.routing import CacheAwareSection
from gateway.pool.health import HealthMonitor
from gateway.pool.model_pool import Backend, ModelPool, Router
from gateway.pool.routing.rendezvous import Rendezvous


def test_least_load_and_round_robin_choices() -> None:
    a, b, c = Backend("a", "u", "m"), Backend("b", "u", "m"), Backend("c", "u", "m")
    pool = ModelPool("m", [a, b, c], "least_load")
    a.num_reported, b.num_inflight, c.num_reported = 5, 1, 2
    assert pool.choose() is b
    assert pool.choose([b]) is c
    b.healthy = False
    assert pool.choose() is c
    rr = ModelPool("m", [a, b, c], "round_robin", panic=False)
    assert [rr.choose() for _ in range(4)] == [a, c, c, a]  # b is down; rotation goes on
    a.healthy = c.healthy = False
    assert rr.choose() is None


def test_panic_routing_uses_every_backend_while_none_is_healthy() -> None:
    a, b, c = Backend("a", "u", "m"), Backend("b", "u", "m"), Backend("c", "u", "m")
    pool = ModelPool("m", [a, b, c], "least_load")
    a.num_reported, b.num_reported, c.num_reported = 5, 1, 2
    b.healthy = False
    assert not pool.panicking() and pool.choose() is c  # one healthy: no panic, b stays out
    a.healthy = c.healthy = False
    assert pool.panicking()
    assert pool.choose() is b  # least load among all of them
    assert pool.choose([b]) is c and pool.choose([a, b, c]) is None  # a retry still goes elsewhere
    rr = ModelPool("m", [a, b, c], "round_robin")
    assert [rr.choose() for _ in range(4)] == [a, b, c, a]
    a.healthy = True
    assert not pool.panicking() and pool.choose() is a and pool.choose([a]) is None
    off = ModelPool("m", [b, c], "least_load", panic=False)
    assert not off.panicking() and off.choose() is None


def test_load_now_adds_this_process_requests_since_the_scrape() -> None:
    b = Backend("a", "u", "m")
    b.num_inflight = 4
    b.num_reported, b.num_inflight_at_scrape = 10, 4  # a scrape: 10 there, 4 of them from here
    assert b.load_now() == 10 and b.load() == 14  # load() counts this process's requests twice
    b.num_inflight = 6  # two more sent since
    assert b.load_now() == 12
    b.num_inflight = 1  # five of ours ended
    assert b.load_now() == 7
    b.num_reported = 0  # an engine that reports nothing: this process's own at least
    assert b.load_now() == 1


def test_a_policy_may_ask_for_fresher_load() -> None:
    entries = [BackendEntry(name="a", url="http://a", model="m")]
    assert Router(entries, "least_load").scrape_interval_s(1.0) == 1.0
    fresh = Router(entries, "cache_aware", CacheAwareSection(load_scrape_interval_s=0.25))
    assert fresh.scrape_interval_s(1.0) == 0.25 and fresh.scrape_interval_s(0.1) == 0.1


class Reports:
    """An upstream client whose backends report running + waiting from a dict (GET /metrics)."""

    def __init__(self, running: dict[str, int]) -> None:
        self.running = running

    async def get(self, url: str, timeout_s: float) -> tuple[int, bytes]:
        host = url.split("//")[1].split("/")[0]
        return 200, f"vllm:num_requests_running {self.running[host]}\nvllm:num_requests_waiting 1\n".encode()


async def test_a_scrape_reads_the_loads_and_the_policy_sees_them() -> None:
    entries = [BackendEntry(name=n, url=f"http://{n}", model="m") for n in ("a", "b")]
    router = Router(entries, "cache_aware", CacheAwareSection(shed_rate=10.0, load_slack=0))
    a, b = router.backends
    a.num_inflight = 3
    monitor = HealthMonitor(router, Reports({"a": 9, "b": 1}), 1.0)  # type: ignore[arg-type]
    await monitor.scrape_all()
    assert (a.num_reported, a.num_inflight_at_scrape, a.load_now()) == (10, 3, 10)
    await monitor.scrape_all()  # the second report moves the shares: a reports far more than the mean
    policy = router.pools["m"].policy
    assert isinstance(policy, Rendezvous) and policy.shed.get(a.url, 0.0) > 0.0 == policy.shed.get(b.url, 0.0)
