"""Two gateway processes (one of them --workers 2) on one real PostgreSQL and one real Redis:
keys, revocations, limits and usage are shared; a SIGKILLed gateway loses at most 1 s of usage;
the database going away and coming back while they serve loses nothing."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from common.net import free_port
from tests.fixtures.postgres import PostgresServer
from tests.fixtures.upstream import UpstreamServer
from tests.gateway.processes import GatewayProcess, call, chat, write_config
from tests.support import zerogap_cmd

ADMIN = "admin-shared-key-77"
NUM_TOKENS = 16  # the fixture upstream's completion length; 3 prompt tokens per request ("a b c")
Pair = tuple[GatewayProcess, GatewayProcess]


def gateway(tmp_path: Path, upstream: str, database_url: str, redis_url: str, workers: int) -> GatewayProcess:
    port = free_port()
    settings = {"database_url": database_url, "redis_url": redis_url}
    config = write_config(tmp_path / f"gw{port}.toml", port, upstream, settings, f'admin_key = "{ADMIN}"')
    return GatewayProcess(config, port, workers)


@pytest.fixture(scope="module")
def pair(tmp_path_factory, database_url, redis_server) -> Iterator[Pair]:
    """One pair for the module's tests (each uses its own key names)."""
    tmp_path = tmp_path_factory.mktemp("pair")
    with UpstreamServer(model="m") as up:
        a = gateway(tmp_path, up.url, database_url, redis_server, 1)
        b = gateway(tmp_path, up.url, database_url, redis_server, 2)
        with a, b:
            yield a, b


def create(gw: GatewayProcess, name: str, **limits: int) -> str:
    status, made = call(gw.url + "/admin/keys", ADMIN, {"name": name, **limits})
    assert status == 201, made
    return str(made["key"])


def usage_of(gw: GatewayProcess, name: str) -> tuple[int, int, int]:
    status, answer = call(gw.url + "/admin/usage", ADMIN)
    assert status == 200, answer
    rows = [r for r in answer["data"] if r["key"] == name]
    return (rows[0]["requests"], rows[0]["prompt_tokens"], rows[0]["completion_tokens"]) if rows else (0, 0, 0)


def seconds_until(gw: GatewayProcess, key: str, status: int, timeout_s: float = 5.0) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if chat(gw.url, key)[0] == status:
            return time.monotonic() - start
        time.sleep(0.02)
    raise AssertionError(f"{gw.url} did not answer {status} within {timeout_s} s")


def eventually(holds: Callable[[], bool], timeout_s: float = 15.0) -> bool:
    """Whether `holds` came true within timeout_s (the usage flushes are periodic: an event to wait for)."""
    deadline = time.monotonic() + timeout_s
    while not holds():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def test_keys_revocations_and_usage_are_shared(pair: Pair) -> None:
    a, b = pair
    key = create(a, "shared")
    assert seconds_until(b, key, 200) <= 1.0
    assert call(b.url + "/admin/keys/shared", ADMIN, method="DELETE")[0] == 200
    assert chat(a.url, key)[0] in (200, 401)  # may still be loaded: no more than a second
    assert seconds_until(a, key, 401) <= 1.0

    counted = create(b, "counted")
    num = 30
    with ThreadPoolExecutor(6) as pool:  # fresh connections: spread over A and both workers of B
        statuses = list(pool.map(lambda i: chat((a, b)[i % 2].url, counted)[0], range(num)))
    assert statuses == [200] * num
    whole = (num, 3 * num, NUM_TOKENS * num)
    assert eventually(lambda: usage_of(a, "counted") == usage_of(b, "counted") == whole), (  # each process flushes
        usage_of(a, "counted"), usage_of(b, "counted"))  # fmt: skip

    # `zerogap keys` without --url works on the same database (config.toml's database_url).
    listed = subprocess.run(zerogap_cmd("keys", "--config", str(a.config), "list"), capture_output=True, timeout=30)
    line = next(x for x in listed.stdout.decode().splitlines() if x.startswith("counted "))
    assert line.split()[-2:] == [str(num), str((3 + NUM_TOKENS) * num)] and "revoked" in listed.stdout.decode()
    made = subprocess.run(zerogap_cmd("keys", "--config", str(a.config), "create", "--name", "by-cli"),
                          capture_output=True, timeout=30)  # fmt: skip
    assert seconds_until(b, made.stdout.decode().strip(), 200) <= 1.0


def test_max_concurrency_and_allow_lists_are_shared(pair: Pair) -> None:
    a, b = pair
    status, made = call(a.url + "/admin/keys", ADMIN, {"name": "four-at-once", "models": ["m"], "max_concurrency": 4})
    assert status == 201 and made["max_concurrency"] == 4, made
    listed = {k["name"]: k for k in call(b.url + "/admin/keys", ADMIN)[1]["data"]}
    assert listed["four-at-once"]["max_concurrency"] == 4 and listed["four-at-once"]["models"] == ["m"]
    status, answer = call(b.url + "/admin/keys", ADMIN, {"name": "no-model", "models": [""]})
    assert status == 422 and answer["error"]["param"] == "models"
    cli = subprocess.run(zerogap_cmd("keys", "--config", str(b.config), "create", "--name", "cli-capped",
                                     "--max-concurrency", "9"), capture_output=True, timeout=30)  # fmt: skip
    assert cli.returncode == 0, cli.stderr
    listed = {k["name"]: k for k in call(a.url + "/admin/keys", ADMIN)[1]["data"]}
    assert listed["cli-capped"]["max_concurrency"] == 9 and "no-model" not in listed
    shown = subprocess.run(zerogap_cmd("keys", "--config", str(a.config), "list"), capture_output=True, timeout=30)
    line = next(x for x in shown.stdout.decode().splitlines() if x.startswith("cli-capped "))
    assert line.split()[5] == "9"  # NAME STATUS MODELS RPM TPM MAXCONC


def test_rpm_burst_spread_over_both_is_admitted_within_5_percent(pair: Pair) -> None:
    a, b = pair
    key = create(a, "burst", rpm=60)
    seconds_until(b, key, 200)  # known everywhere (and one request taken)
    start = time.monotonic()
    with ThreadPoolExecutor(16) as pool:
        statuses = list(pool.map(lambda i: chat((a, b)[i % 2].url, key)[0], range(150)))
    elapsed_s = time.monotonic() - start
    admitted = 1 + statuses.count(200)
    assert set(statuses) == {200, 429}
    assert elapsed_s < 3, elapsed_s  # the bucket refills 1 request per second
    assert 57 <= admitted <= 63, (admitted, elapsed_s)


def test_tpm_is_shared_and_settles_on_real_usage(pair: Pair) -> None:
    a, b = pair
    body = {"model": "m", "max_tokens": 100, "messages": [{"role": "user", "content": "a b c"}]}
    estimate = 22 + 100  # 85 bytes / 4, and max_tokens: what the bucket must hold to admit one
    key = create(a, "tokens", tpm=estimate + 9 * (3 + NUM_TOKENS))  # room for ten requests' real usage
    statuses = []
    for i in range(16):  # each reserves 122 tokens, then settles on the 19 it used
        statuses.append(call((a, b)[i % 2].url + "/v1/chat/completions", key, body)[0])
        time.sleep(0.05)  # the settlement reaches Redis
    assert set(statuses) == {200, 429}
    # settled on the estimate instead, two would be admitted; 11: the bucket refills ~5 tokens a second
    assert 10 <= statuses.count(200) <= 11, statuses


def test_sigkill_and_restart_keeps_keys_and_all_but_the_last_second_of_usage(tmp_path, database_url,
                                                                               redis_server) -> None:  # fmt: skip
    with UpstreamServer(model="m") as up:
        gw = gateway(tmp_path, up.url, database_url, redis_server, 2).start()
        try:
            keys = [create(gw, f"k{i}") for i in range(3)]
            assert [chat(gw.url, k)[0] for k in keys * 4] == [200] * 12
            time.sleep(1.2)  # older than the flush interval: must survive
            assert chat(gw.url, keys[0])[0] == 200  # may be lost
            gw.kill()
            gw.start()
            assert [chat(gw.url, k)[0] for k in keys] == [200] * 3
            # the other worker's count too, once it flushes: the admin call flushes only its own process
            assert eventually(lambda: usage_of(gw, "k0")[0] >= 4 + 1)
            used = usage_of(gw, "k0")
        finally:
            gw.stop()
    assert used[0] in (4 + 1, 4 + 1 + 1) and used[1] == 3 * used[0]


def test_database_down_while_serving(pair: Pair, postgres: PostgresServer) -> None:
    a, b = pair
    key = create(a, "steady")
    seconds_until(b, key, 200)
    time.sleep(1.2)
    before = usage_of(a, "steady")[0]
    postgres.stop()
    try:
        time.sleep(1.0)  # both have tried to reach it
        statuses = [chat((a, b)[i % 2].url, key)[0] for i in range(10)]
        status, answer = call(a.url + "/admin/keys", ADMIN, {"name": "during"})
        time.sleep(1.2)  # flushes fail while it is down: the counts stay in memory
    finally:
        postgres.start()
    assert statuses == [200] * 10
    assert status == 503 and answer["error"]["code"] == "store_unavailable"
    deadline = time.monotonic() + 5
    while usage_of(a, "steady")[0] != before + 10 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert usage_of(b, "steady") == (before + 10, 3 * (before + 10), NUM_TOKENS * (before + 10))
    assert "key store unreachable" in a.logs() and "usage flush failed" in a.logs()
    assert "Traceback" not in a.logs() + b.logs()


def test_database_down_at_start_is_a_clear_error(tmp_path, redis_server) -> None:
    dead = f"postgresql://zerogap@127.0.0.1:{free_port()}/nope"
    gw = gateway(tmp_path, "http://127.0.0.1:9", dead, redis_server, 1)
    with pytest.raises(RuntimeError, match="exited with 2"):
        gw.start()
    logs = gw.logs()
    assert "PostgreSQL at 127.0.0.1:" in logs and "[gateway].database_url" in logs and "Traceback" not in logs
