"""gateway/server/middleware.py: ErrorShield and FastPath as plain ASGI, driven directly."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from gateway.server.asgi import Message, Receive, Scope, Send
from gateway.server.middleware import ErrorShield, FastPath


class Recorder:
    def __init__(self) -> None:
        self.messages: list[Message] = []

    async def __call__(self, message: Message) -> None:
        self.messages.append(message)

    @property
    def status(self) -> int:
        return int(self.messages[0]["status"])

    @property
    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.messages[1:])


async def _receive() -> Message:
    return {"type": "http.request", "body": b"", "more_body": False}


def _scope(path: str = "/x") -> dict[str, Any]:
    return {"type": "http", "method": "POST", "path": path, "headers": []}


class App:
    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.state = "the app's state"
        self.seen: list[str] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.seen.append(scope["path"])
        if self.fail:
            raise RuntimeError("secret detail")
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})


async def test_error_shield_answers_an_openai_error_and_logs_the_traceback(caplog) -> None:
    sent = Recorder()
    with caplog.at_level(logging.ERROR, "zerogap.gateway"):
        await ErrorShield(App(fail=True))(_scope(), _receive, sent)
    assert sent.status == 500
    error = json.loads(sent.body)["error"]
    assert error["type"] == "server_error" and "gateway's log" in error["message"]
    assert "secret detail" not in sent.body.decode()  # the detail stays in the log
    assert "secret detail" in caplog.text


async def test_error_shield_passes_a_good_answer_untouched() -> None:
    sent = Recorder()
    await ErrorShield(App())(_scope(), _receive, sent)
    assert sent.status == 204 and len(sent.messages) == 2


async def test_error_shield_after_the_response_started_says_nothing_more() -> None:
    async def half(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        raise RuntimeError("mid-stream")

    sent = Recorder()

    async def strict_send(message: Message) -> None:
        if sent.messages and message["type"] == "http.response.start":
            raise RuntimeError("response already started")
        await sent(message)

    await ErrorShield(half)(_scope(), _receive, strict_send)
    assert [m["type"] for m in sent.messages] == ["http.response.start"]


@pytest.mark.parametrize(("path", "fast"), [("/v1/chat/completions", True), ("/v1/chat/completions/", False)])
async def test_fast_path_dispatches_exact_paths_and_sets_the_app(path: str, fast: bool) -> None:
    app, endpoint = App(), App()
    scope = _scope(path)
    router = FastPath(app, {"/v1/chat/completions": endpoint})
    await router(scope, _receive, Recorder())
    assert (endpoint.seen, app.seen) == (([path], []) if fast else ([], [path]))
    assert router.state == "the app's state"
    if fast:
        assert scope["app"] is app  # endpoints read the app's state through scope["app"]
