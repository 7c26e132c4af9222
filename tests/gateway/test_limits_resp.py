"""gateway/tenants/limits/resp.py: the Redis limiter's one pipelined connection, against a real Redis
(and a server that never answers)."""

from __future__ import annotations

import asyncio
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from redis.exceptions import ConnectionError, InvalidResponse, RedisError, ResponseError, TimeoutError

from common.net import free_port, wait_for_port
from common.process_group import stop_process
from gateway.server.errors import ApiError
from gateway.tenants.auth import Principal
from gateway.tenants.keys.base import KeyLimits
from gateway.tenants.limits.redis import RedisLimiter
from gateway.tenants.limits.redis_lua import SETTLE
from gateway.tenants.limits.resp import _INCOMPLETE, RedisConnection, Script, pack, parse
from tests.tools import require_tool


def test_a_command_is_an_array_of_bulk_strings() -> None:
    assert pack(("EVALSHA", "ab", 2, 1.5, b"x")) == (
        b"*5\r\n$7\r\nEVALSHA\r\n$2\r\nab\r\n$1\r\n2\r\n$3\r\n1.5\r\n$1\r\nx\r\n"
    )
    assert pack(("SET", "k", "é")) == b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$2\r\n\xc3\xa9\r\n"


def test_a_reply_is_read_whole_or_not_at_all() -> None:
    head = b"*3\r\n:1\r\n$0\r\n\r\n$1\r\n0\r\n"  # what HEAD answers when it admits
    assert parse(head, 0) == ([1, b"", b"0"], len(head))
    for cut in range(1, len(head)):  # every split of a read leaves it for the next one
        assert parse(head[:cut], 0) == (_INCOMPLETE, 0), cut
    two = b":7\r\n+OK\r\n"
    assert parse(two, 0) == (7, 4) and parse(two, 4) == (b"OK", len(two))
    assert parse(b"$-1\r\n", 0) == (None, 5) and parse(b"*-1\r\n", 0) == (None, 5)
    nested = b"*2\r\n*1\r\n:1\r\n$2\r\nab\r\n"
    assert parse(nested, 0) == ([[1], b"ab"], len(nested))
    error, end = parse(b"-NOSCRIPT No matching script.\r\n", 0)
    assert isinstance(error, ResponseError) and str(error).startswith("NOSCRIPT") and end == 31
    with pytest.raises(InvalidResponse):
        parse(b"?what\r\n", 0)


def key(**limits: int) -> Principal:
    return Principal(f"k{uuid.uuid4().hex[:8]}", limits=KeyLimits(**limits))


@pytest.fixture
async def connection(redis_server: str) -> AsyncIterator[RedisConnection]:
    conn = RedisConnection(redis_server)
    yield conn
    await conn.close()


async def test_pipelined_replies_reach_their_own_commands(connection: RedisConnection) -> None:
    replies = await asyncio.gather(*(connection.send("ECHO", f"m{i}", flush=i % 3 == 0) for i in range(300)))
    assert replies == [f"m{i}".encode() for i in range(300)]


async def test_a_cancelled_caller_leaves_the_others_in_order(connection: RedisConnection) -> None:
    await connection.send("PING")
    first = connection.send("ECHO", "first")
    first.cancel()  # its reply still comes, and is dropped
    assert await connection.send("ECHO", "second") == b"second"


async def test_a_script_redis_lost_is_sent_whole(connection: RedisConnection) -> None:
    script = Script(connection, "return ARGV[1] .. KEYS[1]")
    assert await script(["k"], ["a"]) == b"ak"
    await connection.send("SCRIPT", "FLUSH")
    assert await script(["k"], ["b"]) == b"bk"  # NOSCRIPT: EVAL, which caches it again
    await connection.send("SCRIPT", "FLUSH")
    assert await script.background(["k"], ["c"]) == b"ck"
    with pytest.raises(ResponseError):
        await Script(connection, "return redis.call('NOSUCHCOMMAND')")([], [])


async def test_the_database_of_the_url(redis_server: str) -> None:
    name = f"k{uuid.uuid4().hex[:8]}"
    db3 = RedisConnection(redis_server.rsplit("/", 1)[0] + "/3")
    db0 = RedisConnection(redis_server)
    try:
        await db3.send("SET", name, "x")
        assert await db3.send("GET", name) == b"x"
        assert await db0.send("GET", name) is None
    finally:
        await db3.close()
        await db0.close()


async def test_a_burst_of_requests_is_admitted_exactly_over_one_connection(redis_server: str) -> None:
    """600 requests of one key at once, then all their ends at once: redis-py's pool of 100
    connections refused such a burst ("Too many connections") and the limiter fell back to
    counting in memory; one pipelined connection takes it, and the cap holds exactly."""
    down: list[str] = []
    limiter = RedisLimiter(redis_server, 60.0, count_down=down.append)
    who = key(rpm=10**6, tpm=10**9, max_concurrency=500)
    try:
        results = await asyncio.gather(*(limiter.admit(who) for _ in range(600)), return_exceptions=True)
        slots = [r for r in results if not isinstance(r, BaseException)]
        refused = [r for r in results if isinstance(r, ApiError)]
        assert len(slots) == 500 and len(refused) == 100, results[:3]
        assert all(e.code == "concurrency_limit" for e in refused)
        await asyncio.gather(*(limiter.reserve(who, 100, 96) for _ in slots))
        for slot in slots:
            assert slot is not None
            limiter.settle(who, 100, 40)
            limiter.release(slot)
        await limiter.idle()
        assert down == [] and not limiter.leases.live
        check = RedisConnection(redis_server)
        assert await check.send("ZCARD", f"zerogap:limit:{who.name}:slots") == 0
        await check.close()
    finally:
        await limiter.close()


class RedisProcess:
    """A redis-server of this test's own, which it stops and starts again on the same port."""

    def __init__(self, tmp: Path) -> None:
        self.port, self.tmp = free_port(), tmp
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        argv = [require_tool("redis-server"), "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                "--appendonly", "no", "--dir", str(self.tmp)]  # fmt: skip
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL)
        wait_for_port(self.port, 60, self.proc)

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)
            self.proc = None


@pytest.fixture
def redis_process(tmp_path: Path) -> Iterator[RedisProcess]:
    r = RedisProcess(tmp_path)
    r.start()
    yield r
    r.stop()


async def test_a_lost_connection_fails_what_is_in_flight_and_the_next_command_reconnects(
    redis_process: RedisProcess,
) -> None:
    conn = RedisConnection(f"redis://127.0.0.1:{redis_process.port}/0")
    try:
        assert await conn.send("PING") == b"PONG"
        blocked = conn.send("BLPOP", "never", 0)  # waits in Redis until the connection goes
        await asyncio.sleep(0.05)
        redis_process.stop()
        with pytest.raises(ConnectionError):
            await blocked
        with pytest.raises((ConnectionError, TimeoutError)):
            await conn.send("PING")
        redis_process.start()
        assert await conn.send("PING") == b"PONG"
    finally:
        await conn.close()


async def test_a_redis_that_never_answers_times_out(tmp_path: Path) -> None:
    accepted: list[asyncio.StreamWriter] = []

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)  # reads nothing, answers nothing

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    conn = RedisConnection(f"redis://127.0.0.1:{port}/0", timeout_s=0.2)
    try:
        started = time.monotonic()
        replies = await asyncio.gather(conn.send("PING"), conn.send("PING", flush=False), return_exceptions=True)
        assert all(isinstance(r, TimeoutError) for r in replies), replies
        assert 0.15 < time.monotonic() - started < 2.0
        down: list[str] = []  # the limiter: Redis is down, counted, and this process's memory admits
        limiter = RedisLimiter(f"redis://127.0.0.1:{port}/0", count_down=down.append)
        limiter._redis.timeout_s = 0.2
        assert await limiter.admit(key(rpm=5)) is None and down == ["local"]
        await limiter.close()
    finally:
        await conn.close()
        for w in accepted:
            w.close()
        server.close()
        await server.wait_closed()


async def test_nothing_listening_is_a_redis_error() -> None:
    conn = RedisConnection(f"redis://127.0.0.1:{free_port()}/0")
    with pytest.raises(RedisError):
        await conn.send("PING")
    await conn.close()
    with pytest.raises(RedisError):  # closed for good
        await conn.send("PING")


async def test_settle_and_release_at_a_requests_end_share_one_write(connection: RedisConnection) -> None:
    protocol_writes: list[bytes] = []
    script = Script(connection, SETTLE)
    await script(["zerogap:test:tpm"], [100, 5])  # Redis has it now: EVALSHA alone
    protocol = connection._protocol
    assert protocol is not None and protocol.transport is not None
    transport = protocol.transport
    real_write = transport.write

    def write(data: bytes) -> None:
        protocol_writes.append(bytes(data))
        real_write(data)

    protocol.transport = type("T", (), {"write": staticmethod(write), "abort": transport.abort,
                                        "close": transport.close})()  # fmt: skip
    try:
        settle = script.background(["zerogap:test:tpm"], [100, 5])
        release = connection.send("ZREM", "zerogap:test:slots", "lease", flush=False)
        assert protocol_writes == []  # not yet: with the next awaited command, or after BACKGROUND_WAIT_S
        await asyncio.gather(settle, release)
        assert len(protocol_writes) == 1 and protocol_writes[0].startswith(b"*6\r\n$7\r\nEVALSHA")
        assert protocol_writes[0].endswith(b"$5\r\nlease\r\n")

        protocol_writes.clear()  # a request's end, then the next admission: one write, in that order
        release = connection.send("ZREM", "zerogap:test:slots", "lease", flush=False)
        assert await connection.send("ECHO", "next") == b"next" and await release == 0
        assert len(protocol_writes) == 1 and protocol_writes[0].index(b"ZREM") < protocol_writes[0].index(b"ECHO")
    finally:
        protocol.transport = transport
