"""gateway/pool/health.py: the load a backend reports on its /metrics, and health checks against
outlier holds (real upstreams on free ports)."""

from __future__ import annotations

from common.config.gateway import BackendEntry, GatewaySection
from gateway.pool.health import HealthMonitor, parse_queue
from gateway.pool.model_pool import Backend, Router
from gateway.pool.outlier import OutlierDetector
from gateway.upstream.http_client import HttpUpstream
from tests.fixtures.upstream import UpstreamServer


def test_parse_queue() -> None:
    text = (
        b"# TYPE vllm:num_requests_running gauge\n"
        b'vllm:num_requests_running{model_name="a"} 3.0\n'
        b'vllm:num_requests_waiting{model_name="a"} 4.0\n'
        b"vllm:num_requests_waiting_by_reason 9\n"
    )
    assert parse_queue(text) == 7
    assert parse_queue(b"garbage\nvllm:num_requests_running x") == 0


async def test_an_outlier_hold_never_leaves_a_model_without_a_backend() -> None:
    """B is held out by the outlier rule; while A is healthy, B's passing health check does not
    bring it back. Once A fails its own, B comes back at its next check, not after its hold."""
    with UpstreamServer(model="m") as up_a, UpstreamServer(model="m") as up_b:
        settings = GatewaySection()
        entries = [BackendEntry(name=n, url=u.url, model="m") for n, u in (("a", up_a), ("b", up_b))]
        router = Router(entries, settings.routing, settings.cache_aware)
        a, b = router.backends

        def take_out(backend: Backend, reason: str) -> None:
            backend.healthy = False

        outlier = OutlierDetector(router, settings, take_out)
        client = HttpUpstream(2.0)
        monitor = HealthMonitor(router, client, 2.0, take_out, outlier.held_s)
        try:
            for _ in range(settings.outlier_consecutive_errors):
                outlier.failure(b, "500")
            assert not b.healthy and outlier.held_s(b) > 29
            await monitor.check_all()
            assert a.healthy and not b.healthy  # held: A serves the model
            up_a.behavior.healthy = False
            await monitor.check_all()  # A leaves; B, checked at the same time, is still held
            await monitor.check_all()
            assert not a.healthy and b.healthy and outlier.held_s(b) > 25
        finally:
            await client.close()
