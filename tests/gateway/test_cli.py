"""`zerogap gateway` and `zerogap keys` as real subprocesses; no secret in logs, metrics or upstream requests."""

from __future__ import annotations

import json
import signal
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from common.net import free_port, wait_for_port
from tests.fixtures.upstream import UpstreamServer
from tests.support import zerogap_cmd

UNIFIED = "unified-cli-secret-42"
METRICS = "metrics-cli-secret-43"


def write_config(
    tmp_path: Path, port: int, upstream_url: str, api_key: str = "${TAOTOKEN_API_KEY}", metrics_key: str = ""
) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(
        f'[server]\nport = {port}\napi_key = "{api_key}"\nbase_url = "http://127.0.0.1:{port}/api"\n'
        f'metrics_key = "{metrics_key}"\n'
        '[gateway]\nkey_store = "state/keys.db"\n'
        f'[[backends]]\nname = "b0"\nurl = "{upstream_url}"\nmodel = "m"\napi_key = "backend-secret-77"\n'
    )
    return path


def request(url: str, key: str, body: dict | None = None) -> tuple[int, bytes]:
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data, headers), timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ('[server]\nport = "eighty"\n', "[server].port"),
        ("[gateway]\nrouting = 'random'\n", "[gateway].routing"),
        ("[gateway]\nbogus = 1\n", "unknown key"),
        ('[server]\napi_key = "${NOT_SET_ANYWHERE_42}"\n', "NOT_SET_ANYWHERE_42"),
        ("[server\n", "not valid TOML"),
        ('[gateway]\nredis_url = "http://127.0.0.1:6379"\n', "[gateway].redis_url"),
        ('[gateway]\nkey_store = "/proc/no-such-dir/keys.db"\n', "[gateway].key_store"),
        (
            '[[backends]]\nname = "a"\nurl = "http://x:1"\nmodel = "m"\n[[backends]]\nname = "a"\n'
            'url = "http://x:2"\nmodel = "m"\n',
            "share a name",
        ),
    ],
)
def test_bad_config_exits_with_a_clear_message(tmp_path, clean_env, text, words) -> None:
    path = tmp_path / "config.toml"
    path.write_text(text)
    proc = subprocess.run(zerogap_cmd("gateway", "--config", str(path)), capture_output=True, env=clean_env, timeout=30)
    stderr = proc.stderr.decode()
    assert proc.returncode != 0 and words in stderr and "Traceback" not in stderr


def test_missing_config_file(tmp_path, clean_env) -> None:
    proc = subprocess.run(
        zerogap_cmd("gateway", "--config", str(tmp_path / "nope.toml")), capture_output=True, env=clean_env, timeout=30
    )
    assert proc.returncode != 0 and b"no such file" in proc.stderr and b"Traceback" not in proc.stderr


def test_gateway_serves_and_keeps_secrets_out_of_logs_metrics_and_upstream(tmp_path, clean_env) -> None:
    port = free_port()
    with UpstreamServer(model="m") as up:
        path = write_config(tmp_path, port, up.url, metrics_key=METRICS)  # per-key series
        keys = subprocess.run(
            zerogap_cmd("keys", "--config", str(path), "create", "--name", "dave", "--rpm", "100"),
            capture_output=True, env=clean_env, timeout=30, check=True,
        )  # fmt: skip
        virtual = keys.stdout.decode().strip()
        env = {**clean_env, "TAOTOKEN_API_KEY": UNIFIED}
        proc = subprocess.Popen(
            zerogap_cmd("gateway", "--config", str(path), "--log-level", "debug"),
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        try:
            wait_for_port(port, 120, proc)
            base = f"http://127.0.0.1:{port}"
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
            for key in (UNIFIED, virtual, "wrong-key-" + UNIFIED):
                request(base + "/api/v1/chat/completions", key, body)
            status, metrics = request(base + "/metrics", METRICS)
            assert status == 200
        finally:
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=15)
    assert proc.returncode in (0, -signal.SIGTERM), err.decode()  # uvicorn re-raises the signal it caught
    assert len(up.requests) == 2 and all(r.headers["Authorization"] == "Bearer backend-secret-77" for r in up.requests)
    logs = (out + err).decode()
    assert "DEBUG" in logs and "dave" not in metrics.decode().replace('key="dave"', "")
    upstream_seen = json.dumps([(r.headers, r.body) for r in up.requests])
    for secret in (UNIFIED, METRICS, virtual, virtual[3:]):
        assert secret not in logs
        assert secret not in metrics.decode()
        assert secret not in upstream_seen
        assert secret.encode() not in (tmp_path / "state" / "keys.db").read_bytes()
    assert "backend-secret-77" not in logs and "backend-secret-77" not in metrics.decode()
    assert 'key="dave"' in metrics.decode() and 'key="unified"' in metrics.decode()


def test_port_in_use_is_a_clear_error(tmp_path, clean_env) -> None:
    with UpstreamServer(model="m") as up:
        path = write_config(tmp_path, up.port, up.url, api_key="x" * 16)  # the upstream holds the port
        proc = subprocess.run(zerogap_cmd("gateway", "--config", str(path)), capture_output=True, env=clean_env,
                              timeout=30)  # fmt: skip
    assert proc.returncode != 0 and b"could not serve" in proc.stderr and b"Traceback" not in proc.stderr


def test_keys_cli_create_list_revoke(tmp_path, clean_env) -> None:
    path = write_config(tmp_path, free_port(), "http://127.0.0.1:9")

    def keys(*args: str) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(zerogap_cmd("keys", "--config", str(path), *args), capture_output=True, env=clean_env,
                              timeout=30)  # fmt: skip

    created = keys("create", "--name", "erin", "--models", "m,x", "--tpm", "1000", "--expires-in", "7")
    secret = created.stdout.decode().strip()
    assert created.returncode == 0 and secret.startswith("zg-") and len(secret) > 30
    assert keys("create", "--name", "erin").returncode != 0
    dup = keys("create", "--name", "erin")
    assert b"exists already" in dup.stderr and b"Traceback" not in dup.stderr
    listed = keys("list").stdout.decode()
    assert "erin" in listed and "active" in listed and "m,x" in listed and secret not in listed
    assert keys("revoke", "erin").returncode == 0
    assert "revoked" in keys("list").stdout.decode()
    missing = keys("revoke", "nobody")
    assert missing.returncode == 1 and b"no active key named 'nobody'" in missing.stderr
    bad = keys("create", "--name", "x", "--rpm", "0")
    assert bad.returncode == 2 and b"positive" in bad.stderr
    reserved = keys("create", "--name", "unified")
    assert reserved.returncode != 0 and b"reserved" in reserved.stderr


def test_keys_cli_takes_config_after_the_command(tmp_path, clean_env) -> None:
    path = write_config(tmp_path, free_port(), "http://127.0.0.1:9")
    created = subprocess.run(zerogap_cmd("keys", "create", "--name", "frank", "--config", str(path)),
                             capture_output=True, env=clean_env, timeout=30)  # fmt: skip
    assert created.returncode == 0, created.stderr
    listed = subprocess.run(zerogap_cmd("keys", "list", "--config", str(path)), capture_output=True, env=clean_env,
                            timeout=30)  # fmt: skip
    assert b"frank" in listed.stdout
