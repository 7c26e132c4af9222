"""Log lines a client causes with each request are logged at most once per interval per kind, with
a count (gateway/observe/log_throttle.py): a flood of malformed requests against a real `zerogap gateway`
process leaves a few lines, whose counts add up to the flood."""

from __future__ import annotations

import json
import logging
import re
import socket
from pathlib import Path

from common.net import free_port
from gateway.observe.log_throttle import LogThrottle
from tests.fixtures.upstream import UpstreamServer
from tests.gateway.processes import UNIFIED, GatewayProcess, call, write_config

NUM = 1000
SUMMARY = re.compile(r"\[(\d+) more like this in the last \d+ s\]")


class Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_the_first_line_of_a_kind_then_one_count_per_interval() -> None:
    noisy, calm = logging.getLogger("test.throttle.noisy"), logging.getLogger("test.throttle.calm")
    kept = Kept()
    throttle = LogThrottle(rules={noisy.name: lambda r: r.levelno >= logging.WARNING, calm.name: lambda r: False})
    throttle.install()
    for logger in (noisy, calm):
        logger.addHandler(kept)
        logger.propagate = False
        logger.setLevel(logging.INFO)
    try:
        for i in range(NUM):
            noisy.warning("bad request from %s", f"client{i}")
            noisy.info("an info line %d", i)  # below the rule's level: never held back
        calm.warning("a calm line")
        calm.warning("a calm line")
        throttle.flush()
        after_one = list(kept.lines)
        throttle.flush()  # nothing held since: no line; the kind's quiet period ends
        noisy.warning("bad request from %s", "again")
        noisy.warning("bad request from %s", "and again")
        throttle.flush()
    finally:
        throttle.uninstall()
        for logger in (noisy, calm):
            logger.removeHandler(kept)
            logger.propagate = True
            logger.setLevel(logging.NOTSET)
    warnings = [line for line in after_one if line.startswith("bad request")]
    assert warnings[0] == "bad request from client0"
    assert re.fullmatch(r"bad request from client999 \[999 more like this in the last \d+ s\]", warnings[1])
    assert len(warnings) == 2 and len([line for line in after_one if line.startswith("an info")]) == NUM
    assert after_one.count("a calm line") == 2
    assert kept.lines[len(after_one) :] == ["bad request from again", "bad request from and again [1 more like this"
                                            " in the last 0 s]"]  # fmt: skip


HELD = [  # (logger, level, template): a client causes them, one per request
    ("uvicorn.error", logging.WARNING, "Invalid HTTP request received."),
    ("zerogap.gateway.http", logging.INFO, "%s: %d, closing: %s"),
    (
        "zerogap.gateway.auth",
        logging.WARNING,
        "client %s: %d failed authentications within %g s: refused (429) for %g s",
    ),
    ("zerogap.gateway.client_side", logging.WARNING, "a keep-alive comment could not be sent: %r"),
]
NEVER_HELD = [  # about the gateway's own state: every line counts
    ("zerogap.gateway.auth", logging.WARNING, "key store reachable again: virtual keys are checked against it again"),
    ("uvicorn.error", logging.INFO, "Started server process [%d]"),
    ("zerogap.gateway.relay", logging.WARNING, "backend %s answered %s: %r"),
]


def test_the_client_caused_lines_are_held_back_and_the_gateways_own_are_not() -> None:
    throttle = LogThrottle()
    for name, level, template in HELD + NEVER_HELD:
        passed = [throttle.filter(logging.LogRecord(name, level, __file__, 1, template, None, None)) for _ in range(3)]
        assert passed == ([True, False, False] if (name, level, template) in HELD else [True] * 3), (name, template)


def send_raw(port: int, data: bytes, source: str = "127.0.0.1") -> bytes:
    """One request on its own connection, from `source` (any address of 127.0.0.0/8 is this host's)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0)) as sock:
        sock.sendall(data)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
            if b"\r\n\r\n" in answer:
                break
        return answer


def counted(lines: list[str]) -> int:
    """The occurrences the lines stand for: 1 for a line logged as it came, N for a count of N held back."""
    return sum(int(m.group(1)) if (m := SUMMARY.search(line)) else 1 for line in lines)


def bad_key(i: int) -> bytes:
    return (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer zg-wrong-key-{i:012d}\r\n"
        "Content-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}"
    ).encode()


def test_a_flood_of_malformed_requests_leaves_a_few_lines_with_a_count(tmp_path: Path) -> None:
    port = free_port()
    garbage = b"NOT HTTP AT ALL\r\n\r\n"
    upgrade = b"GET /health HTTP/1.1\r\nHost: gw\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"
    too_large = b"GET /health HTTP/1.1\r\nHost: gw\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n"
    with UpstreamServer(model="m") as up:
        with GatewayProcess(write_config(tmp_path / "config.toml", port, up.url, {}), port) as gw:
            answers = [send_raw(port, garbage) for _ in range(NUM)]
            answers += [send_raw(port, upgrade) for _ in range(NUM // 4)]
            answers += [send_raw(port, too_large) for _ in range(NUM // 4)]
            bodies = [call(gw.url + "/v1/chat/completions", UNIFIED, f"{{not json {i}") for i in range(NUM // 4)]
            bad_keys = [send_raw(port, bad_key(i), f"127.0.0.{2 + i // 20}") for i in range(100)]
        logs = gw.logs()  # stopped: what was held back is counted in the log
    assert all(answer.startswith((b"HTTP/1.1 400", b"HTTP/1.1 200", b"HTTP/1.1 431")) for answer in answers)
    assert {status for status, _ in bodies} == {400}
    assert {answer[:12] for answer in bad_keys} == {b"HTTP/1.1 401"}  # each address's 20th failure blocks it
    warnings = [line for line in logs.splitlines() if " WARNING " in line]
    for text, num in (
        ("Invalid HTTP request received.", NUM),
        ("Unsupported upgrade request.", NUM // 4),
        ("No supported WebSocket library detected.", NUM // 4),
        ("failed authentications within", 5),  # 5 addresses, each blocked after its 20 failures
    ):
        lines = [line for line in warnings if text in line]
        assert counted(lines) == num and 1 <= len(lines) <= 3, (text, lines)
    refusals = [line for line in logs.splitlines() if ": 431, closing: " in line]  # INFO, one per refused client
    assert counted(refusals) == NUM // 4
    assert 1 <= len(refusals) <= 3, refusals
    assert len(warnings) <= 12, json.dumps(warnings, indent=1)  # no line per request
