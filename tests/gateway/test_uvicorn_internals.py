"""What the gateway relies on inside uvicorn, checked on the installed one (pyproject.toml pins
uvicorn below the next minor; raise the pin only with this file green). Each failure names the
uvicorn internal and the gateway file that relies on it.

- The real protocol, driven over a real connection: the fast paths that fall back without a word
  when uvicorn changes (gateway/relay/chunk_writer.py's direct write, gateway/relay/client_side.py's
  disconnect hook) must engage, and [server].idle_connection_timeout_s must arm uvicorn's
  keep-alive timer (gateway/server/http_limits.py replaces its timeout_keep_alive).
- A fingerprint of each uvicorn method the gateway copies or whose order it relies on (its syntax
  tree, so formatting, comments and docstrings do not count): when one changes, re-read it beside
  the gateway's code named in its line, then record the new fingerprint here.
"""

from __future__ import annotations

import ast
import asyncio
import hashlib
import inspect
import textwrap
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httptools
import pytest
import uvicorn
from packaging.requirements import Requirement
from packaging.version import Version
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol, RequestResponseCycle
from uvicorn.server import ServerState

from gateway.relay.chunk_writer import CYCLE_FIELDS, chunk_writer
from gateway.relay.client_side import _GoneEvent, _hookable
from gateway.server.http_limits import LimitedHttpProtocol, protocol_class
from gateway.server.http_refusals import HttpLimits

ROOT = Path(__file__).resolve().parents[2]
VERSION = uvicorn.__version__
IDLE_S = 123.0  # an idle timeout no default has

# uvicorn's method -> (its fingerprint on the uvicorn these were read against, what relies on it)
RELIED_ON: dict[str, tuple[str, str]] = {
    "HttpToolsProtocol.data_received": (
        "8583b7d501b5", "gateway/server/http_limits.py LimitedHttpProtocol.data_received is a copy of it"),
    "HttpToolsProtocol.connection_lost": (
        "8a5a84898dab", "gateway/relay/client_side.py _GoneEvent: `disconnected` is set before the message event"),
    "HttpToolsProtocol.on_headers_complete": (
        "f5d7f89383b9", "gateway/server/http_refusals.py _refuse_request: a pipelined request queues self.app"),
    "HttpToolsProtocol.on_message_complete": (
        "4ce97e51d988", "gateway/server/http_limits.py on_message_complete gives the cycle's keep_alive back first"),
    "HttpToolsProtocol.on_response_complete": (
        "3b835da51ff0", "gateway/server/http_limits.py: its timeout_keep_alive (the idle timeout) arms the timer"),
    "HttpToolsProtocol.shutdown": (
        "7fa717a61d60", "gateway/server/http_limits.py shutdown and _hold_keep_alive (keep_alive off: close after)"),
    "RequestResponseCycle.send": (
        "e4355b337add", "gateway/relay/chunk_writer.py writes a body chunk as send does, in the states it reads"),
    "RequestResponseCycle.receive": (
        "5c6d69bd5c2e", "gateway/relay/client_side.py resumes reading as receive does, and hooks its message event"),
    "Server.handle_exit": (
        "7ea8c96125df", "gateway/pool/drain.py DrainingServer.handle_exit: should_exit before, force_exit after"),
}  # fmt: skip
OWNERS = {"HttpToolsProtocol": HttpToolsProtocol, "RequestResponseCycle": RequestResponseCycle,
          "Server": uvicorn.Server}  # fmt: skip


def fingerprint(function: Callable[..., Any]) -> str:
    """The function as its syntax tree writes it back (ast.unparse), without its docstring, hashed:
    formatting and comments do not count (nor the Python version, as ast.dump's fields would)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    node = tree.body[0]
    assert isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    body = node.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        node.body = body[1:]
    return hashlib.sha256(ast.unparse(tree).encode()).hexdigest()[:12]


def test_the_installed_uvicorn_is_inside_the_pinned_range() -> None:
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (pin,) = [Requirement(d) for d in dependencies if Requirement(d).name == "uvicorn"]
    assert any(spec.operator == "<" for spec in pin.specifier), f"pyproject.toml: {pin} has no upper bound"
    assert Version(VERSION) in pin.specifier, f"uvicorn {VERSION} is outside pyproject.toml's {pin}"


@pytest.mark.parametrize("name", sorted(RELIED_ON))
def test_each_uvicorn_method_the_gateway_relies_on_is_the_one_it_was_read_against(name: str) -> None:
    recorded, relied_on_by = RELIED_ON[name]
    owner, method = name.split(".")
    found = getattr(OWNERS[owner], method, None)
    assert found is not None, f"uvicorn {VERSION} has no {name}: {relied_on_by}"
    assert fingerprint(found) == recorded, (
        f"uvicorn {VERSION} changed {name} (fingerprint {fingerprint(found)}, read against {recorded}): "
        f"{relied_on_by}. Re-read both, then record the new fingerprint in {Path(__file__).name}."
    )


def test_the_names_and_shapes_the_gateway_uses_are_there() -> None:
    """What the gateway's protocol subclass calls or reads by name (gateway/server/http_limits.py,
    gateway/server/http_refusals.py) and uvicorn's server (gateway/pool/drain.py, gateway/cli.py)."""
    params = list(inspect.signature(HttpToolsProtocol.__init__).parameters)
    assert params == ["self", "config", "server_state", "app_state", "_loop"], f"HttpToolsProtocol.__init__{params}"
    for method in ("_unset_keepalive_if_required", "send_400_response", "_should_upgrade", "handle_websocket_upgrade",
                   "_unsupported_upgrade_warning", "on_message_begin", "eof_received", "connection_made"):  # fmt: skip
        assert callable(getattr(HttpToolsProtocol, method, None)), f"uvicorn {VERSION}: no HttpToolsProtocol.{method}"
    assert all(isinstance(STATUS_LINE[s], bytes) for s in (400, 408, 431, 503)), "uvicorn's STATUS_LINE changed"
    assert isinstance(ServerState().default_headers, list), "uvicorn's ServerState.default_headers changed"
    assert hasattr(httptools, "HttpParserError") and hasattr(httptools, "HttpParserUpgrade")
    config = uvicorn.Config(app=_ok_app, log_config=None)
    assert hasattr(config, "timeout_graceful_shutdown"), "uvicorn.Config.timeout_graceful_shutdown (drain.py)"
    server = uvicorn.Server(config)
    for name in ("started", "should_exit", "force_exit"):
        assert hasattr(server, name), (
            f"uvicorn {VERSION}: uvicorn.Server.{name} (gateway/pool/drain.py, gateway/cli.py)"
        )
    assert list(inspect.signature(uvicorn.Server.serve).parameters) == ["self", "sockets"], "uvicorn.Server.serve"
    startup = inspect.getsource(uvicorn.Server.startup)
    assert "self.servers" in startup, "uvicorn.Server.servers (gateway/pool/drain.py closes them to stop accepting)"


async def _ok_app(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b""})


class Served:
    """An app behind the gateway's protocol class on a real listening socket (no uvicorn.Server:
    the protocol is what the gateway subclasses). `ended` resolves when the app returns (with what it
    raised), `lost` when uvicorn's connection_lost has run."""

    def __init__(self, app: Callable[..., Any]) -> None:
        loop = asyncio.get_running_loop()
        self.ended: asyncio.Future[BaseException | None] = loop.create_future()
        self.lost = asyncio.Event()

        async def watched(scope: Any, receive: Any, send: Any) -> None:
            try:
                await app(scope, receive, send)
            except BaseException as exc:
                self.ended.set_result(exc)
                raise
            self.ended.set_result(None)

        config = uvicorn.Config(app=watched, ws="none", lifespan="off", log_config=None)
        config.load()
        self.config, self.state, lost = config, ServerState(), self.lost

        class Protocol(protocol_class(HttpLimits(idle_connection_timeout_s=IDLE_S))):  # type: ignore[misc]
            def connection_lost(self, exc: Exception | None) -> None:
                super().connection_lost(exc)
                lost.set()

        self.cls = Protocol
        self.protocols: list[LimitedHttpProtocol] = []

    def make(self) -> LimitedHttpProtocol:
        protocol = self.cls(self.config, self.state, {}, asyncio.get_running_loop())
        self.protocols.append(protocol)
        return protocol

    async def app_ended(self) -> None:
        raised = await asyncio.wait_for(self.ended, 30)
        assert raised is None, f"uvicorn {VERSION}: the app raised {raised!r} under the gateway's protocol"


async def _connect(served: Served) -> tuple[asyncio.Server, asyncio.StreamReader, asyncio.StreamWriter]:
    server = await asyncio.get_running_loop().create_server(served.make, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    return server, reader, writer


async def _closed(server: asyncio.Server, writer: asyncio.StreamWriter) -> None:
    writer.close()
    await writer.wait_closed()
    server.close()
    await server.wait_closed()


# What gateway/http_limits.py and http_refusals.py read or set on uvicorn's protocol, its cycle, its flow.
PROTOCOL_FIELDS = ("cycle", "parser", "flow", "transport", "client", "loop", "app", "server_state", "headers", "url",
                   "logger", "timeout_keep_alive", "timeout_keep_alive_task")  # fmt: skip
CYCLE_READ = ("more_body", "keep_alive", "response_started", "response_complete", "disconnected", "message_event")
FLOW_READ = ("read_paused", "write_paused", "pause_reading", "resume_reading")
REQUEST = b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{}"


async def test_a_streamed_chunk_is_written_directly_and_the_idle_timeout_arms_keep_alive() -> None:
    seen: dict[str, Any] = {}

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        write = chunk_writer(send)
        seen["writer"], seen["hook"] = write, _hookable(receive)
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        seen["wrote"] = write is not None and write(b"direct")
        await send({"type": "http.response.body", "body": b"last", "more_body": False})

    served = Served(app)
    server, reader, writer = await _connect(served)
    try:
        writer.write(REQUEST)
        await served.app_ended()
        assert seen["writer"] is not None, (
            f"uvicorn {VERSION}: gateway/relay/chunk_writer.py found no RequestResponseCycle.send with {CYCLE_FIELDS} "
            "and flow.write_paused: every relayed chunk now goes through send (slower)"
        )
        response = await asyncio.wait_for(reader.readuntil(b"0\r\n\r\n"), 30)
        assert seen["wrote"] and b"6\r\ndirect\r\n4\r\nlast\r\n0\r\n\r\n" in response, response
        assert seen["hook"] is not None, (
            f"uvicorn {VERSION}: gateway/relay/client_side.py cannot hook the cycle behind receive (message_event, "
            "disconnected, flow.resume_reading): each relayed request now watches receive() in a task"
        )
        (protocol,) = served.protocols
        for name in PROTOCOL_FIELDS:
            assert hasattr(protocol, name), (
                f"uvicorn {VERSION}: no HttpToolsProtocol.{name} (gateway/server/http_limits.py)"
            )
        for name in CYCLE_READ:
            assert hasattr(seen["hook"], name), f"uvicorn {VERSION}: no RequestResponseCycle.{name} (gateway/http_*.py)"
        for name in FLOW_READ:
            assert hasattr(protocol.flow, name), (
                f"uvicorn {VERSION}: no FlowControl.{name} (gateway/server/http_refusals.py)"
            )
        assert protocol.logger.name == "uvicorn.error", (
            "gateway/observe/log_throttle.py throttles uvicorn.error's lines"
        )
        timer = protocol.timeout_keep_alive_task
        assert timer is not None, f"uvicorn {VERSION}: no HttpToolsProtocol.timeout_keep_alive_task after a response"
        left_s = timer.when() - asyncio.get_running_loop().time()
        assert IDLE_S - 30 < left_s <= IDLE_S, (
            f"uvicorn {VERSION}: its keep-alive timer ({left_s:.0f} s) does not read timeout_keep_alive, which "
            "gateway/server/http_limits.py sets to [server].idle_connection_timeout_s"
        )
    finally:
        await _closed(server, writer)


async def test_a_client_that_hangs_up_calls_the_hook_from_uvicorns_connection_lost() -> None:
    hooked, gone = asyncio.Event(), asyncio.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        cycle = _hookable(receive)
        hooked.set()
        assert cycle is not None, (
            f"uvicorn {VERSION}: gateway/relay/client_side.py cannot hook the cycle behind receive"
        )
        cycle.message_event = _GoneEvent(cycle, gone.set)
        cycle.flow.resume_reading()
        await gone.wait()  # in flight, as a relayed request is, until its client hangs up

    served = Served(app)
    server, _, writer = await _connect(served)
    try:
        writer.write(REQUEST)
        started: asyncio.Future[Any] = asyncio.ensure_future(hooked.wait())
        await asyncio.wait([started, served.ended], timeout=30, return_when=asyncio.FIRST_COMPLETED)
        if served.ended.done():  # it could not hook: says why
            await served.app_ended()
        writer.close()
        await asyncio.wait_for(served.lost.wait(), 30)
        assert gone.is_set(), (
            f"uvicorn {VERSION}: HttpToolsProtocol.connection_lost did not set the cycle's `disconnected` before "
            "its message event: gateway/relay/client_side.py never sees a client that hung up"
        )
        await served.app_ended()
    finally:
        await _closed(server, writer)
