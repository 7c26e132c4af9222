"""A backend URL's user:password@ and query never reach the gateway's log: the lines that say a
backend left the pool or came back show it without them."""

from __future__ import annotations

import logging

import pytest

from tests.fixtures.upstream import UpstreamServer
from tests.gateway.helpers import GatewayServer, make_config, wait_until


async def test_leaving_and_returning_backends_are_logged_without_credentials(tmp_path, caplog) -> None:
    caplog.set_level(logging.INFO, logger="zerogap")
    with UpstreamServer(model="m") as up:
        secret_url = up.url.replace("http://", "http://admin:s3cret-pw@") + "?token=t0ps3cret"
        with GatewayServer(make_config(tmp_path, [("b0", secret_url, "m")])) as gs:
            backend = gs.gw.router.backends[0]
            up.behavior.healthy = False
            assert await wait_until(lambda: not backend.healthy, 10)
            up.behavior.healthy = True
            await wait_until(lambda: backend.healthy, 10)
    lines = [r.getMessage() for r in caplog.records if "backend b0" in r.getMessage()]
    assert any("leaves the pool" in line for line in lines), lines
    for line in lines:
        assert "s3cret" not in line and "t0ps3cret" not in line and "admin" not in line, line


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("http://u:p@10.0.0.5:8000/v1?key=x#f", "http://10.0.0.5:8000/v1"),
        ("http://[::1]:8100/", "http://[::1]:8100"),
        ("https://host.example", "https://host.example"),
    ],
)
def test_public_url_drops_credentials_query_and_fragment(url: str, shown: str) -> None:
    from common.net import public_url

    assert public_url(url) == shown
