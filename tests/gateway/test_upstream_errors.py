"""What a client reads when a backend fails: the backend's configured name and the kind of failure,
never its address, port, errno or 5xx body (a map of the internal network for any tenant). The
whole story goes to the gateway's log at warning. Real gateway, real fixture upstream."""

from __future__ import annotations

import json
import logging

import pytest

from common.net import free_port
from tests.fixtures.upstream import Behavior, UpstreamServer
from tests.gateway.helpers import GatewayServer, auth, chat_body, error_of, events, make_config, post

BODY_500 = "failing on purpose with"  # the fixture's 5xx body text


def assert_private(message: str, port: int) -> None:
    for secret in ("127.0.0.1", "localhost", str(port), "http://", "rrno", BODY_500, "Connect call", "refused ("):
        assert secret not in message, (secret, message)


def warnings(caplog: pytest.LogCaptureFixture) -> str:
    return "\n".join(r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING)


@pytest.mark.parametrize("fail_status", [500, 503])
async def test_a_5xx_names_the_backend_and_status_and_keeps_its_body_for_the_log(tmp_path, caplog, fail_status) -> None:
    with UpstreamServer(Behavior(fail_status=fail_status), model="m") as up:
        with GatewayServer(make_config(tmp_path, [("b0", up.url, "m")], {"max_retries": 0})) as gs:
            status, _, raw = await post(gs.url + "/v1/chat/completions", chat_body(), auth())
    message = error_of(raw)["message"]
    assert status == 502 and message == f"Backend b0 answered {fail_status}."
    assert_private(raw.decode(), up.port)
    assert f"{BODY_500} {fail_status}" in warnings(caplog)  # the body, for whoever runs the gateway


async def test_a_refused_connection_says_so_without_the_address(tmp_path, caplog) -> None:
    port = free_port()  # nothing listens there
    with GatewayServer(make_config(tmp_path, [("b0", f"http://127.0.0.1:{port}", "m")], {"max_retries": 0})) as gs:
        status, _, raw = await post(gs.url + "/v1/chat/completions", chat_body(stream=False), auth())
    message = error_of(raw)["message"]
    assert status in (502, 503) and "b0 refused the connection" in message, message  # 503: tried anyway (panic)
    assert_private(raw.decode(), port)
    assert f"127.0.0.1:{port}" in warnings(caplog)


@pytest.mark.parametrize(
    ("fail_status", "fail_body", "status"),
    [
        (501, None, 502),  # a 5xx that is not retried: its body is still not passed on
        (404, "<html>nginx/1.18.0 at 10.0.0.7:8000</html>", 404),  # a 4xx that is no OpenAI error: a proxy's page
    ],
)
async def test_bodies_that_are_no_openai_error_are_replaced(tmp_path, caplog, fail_status, fail_body, status) -> None:
    with UpstreamServer(Behavior(fail_status=fail_status, fail_body=fail_body), model="m") as up:
        with GatewayServer(make_config(tmp_path, [("b0", up.url, "m")], {"max_retries": 0})) as gs:
            got, _, raw = await post(gs.url + "/v1/chat/completions", chat_body(stream=False), auth())
    message = error_of(raw)["message"]
    assert got == status and message == f"Backend b0 answered {fail_status} (its body is in the gateway's log)."
    assert_private(raw.decode(), up.port)
    assert "10.0.0.7" not in raw.decode() and (fail_body or BODY_500) in warnings(caplog)


async def test_the_backends_credentials_refused_is_the_gateways_problem_not_the_clients(tmp_path, caplog) -> None:
    with UpstreamServer(Behavior(api_key="the-backend-key-123"), model="m") as up:  # the gateway sends none
        with GatewayServer(make_config(tmp_path, [("b0", up.url, "m")], {"max_retries": 0})) as gs:
            status, _, raw = await post(gs.url + "/v1/chat/completions", chat_body(stream=False), auth())
    assert status == 502 and error_of(raw)["message"] == "Backend b0 refused the gateway's credentials."
    assert "answered 401 (check its api_key)" in warnings(caplog)


async def test_errors_inside_a_stream_are_as_private(tmp_path, caplog) -> None:
    settings = {"first_byte_timeout_s": 0.6, "keepalive_interval_s": 0.1, "max_retries": 0, "idle_timeout_s": 5}
    with UpstreamServer(Behavior(num_output_tokens=50, close_after_tokens=3), model="m") as up:
        with GatewayServer(make_config(tmp_path, [("b0", up.url, "m")], settings)) as gs:
            _, _, broken = await post(gs.url + "/v1/chat/completions", chat_body(), auth())
            up.behavior.hang_before_headers = True  # keep-alives start the stream; then the first byte times out
            _, _, late = await post(gs.url + "/v1/chat/completions", chat_body(), auth())
            up.behavior.hang_before_headers, up.behavior.close_after_tokens = False, None
            _, _, whole = await post(gs.url + "/v1/chat/completions", chat_body(stream=False), auth())
    for raw, code, words in ((broken, 502, "Backend b0 broke the stream (it"), (late, 504, "first_byte_timeout_s")):
        assert events(raw)[-1] == "[DONE]"
        error = json.loads(events(raw)[-2])["error"]
        assert error["code"] == code and words in error["message"], error
        assert_private(raw.decode(), up.port)
    assert b": keep-alive" in late
    assert json.loads(whole)["choices"]  # the backend itself is fine
    assert "broke the stream" in warnings(caplog)
