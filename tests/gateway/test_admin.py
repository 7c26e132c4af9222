"""The admin API ([server].admin_key) and `zerogap keys --url`, on a real gateway; every bad input
gets the OpenAI error shape with the field it is about."""

from __future__ import annotations

import http.client
import json
import subprocess
import urllib.error
import urllib.parse
import urllib.request

import pytest

from tests.fixtures.upstream import UpstreamServer
from tests.gateway.helpers import GatewayServer, make_config
from tests.gateway.processes import call, chat
from tests.support import zerogap_cmd

ADMIN = "admin-secret-4242"


def is_error(answer: object, status: int, code: str | None = None, param: str | None = None) -> bool:
    assert isinstance(answer, dict) and set(answer) == {"error"}, answer
    err = answer["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"], err
    return (code is None or err["code"] == code) and (param is None or err["param"] == param)


@pytest.fixture
def gateway(tmp_path):
    with UpstreamServer(model="m") as up, GatewayServer(make_config(tmp_path, [("b0", up.url, "m")],
                                                                    admin_key=ADMIN)) as gs:  # fmt: skip
        yield gs


def test_create_list_use_usage_revoke(gateway) -> None:
    base = gateway.url
    status, made = call(base + "/admin/keys", ADMIN, {"name": "team-a", "models": ["m"], "rpm": 100,
                                                       "expires_in_days": 1})  # fmt: skip
    assert status == 201 and made["key"].startswith("zg-") and made["name"] == "team-a" and made["rpm"] == 100
    assert made["expires_at"] is not None and made["revoked"] is False
    assert [chat(base, made["key"])[0] for _ in range(3)] == [200, 200, 200]
    status, listed = call(base + "/admin/keys", ADMIN)
    assert status == 200 and [k["name"] for k in listed["data"]] == ["team-a"]
    assert made["key"] not in str(listed) and "digest" not in listed["data"][0]
    status, usage = call(base + "/admin/usage", ADMIN)
    expected = {"key": "team-a", "model": "m", "requests": 3, "prompt_tokens": 9, "completion_tokens": 3 * 16}
    assert status == 200 and usage["data"] == [expected]  # the fixture answers 16 tokens
    status, gone = call(base + "/admin/keys/team-a", ADMIN, method="DELETE")
    assert status == 200 and gone == {"name": "team-a", "revoked": True}
    assert chat(base, made["key"])[0] == 401  # at once in the process that revoked it
    assert call(base + "/admin/keys", ADMIN)[1]["data"][0]["revoked"] is True


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({}, 422, "name"),
        ({"name": 42}, 422, "name"),
        ({"name": ""}, 422, "name"),
        ({"name": "a b"}, 422, "name"),
        ({"name": "x", "rpm": "60"}, 422, "rpm"),
        ({"name": "x", "rpm": 0}, 422, "rpm"),
        ({"name": "x", "tpm": 1.5}, 422, "tpm"),
        ({"name": "x", "models": "m"}, 422, "models"),
        ({"name": "x", "expires_in_days": -1}, 422, "expires_in_days"),
        ({"name": "x", "expires_in_days": 36_501}, 422, "expires_in_days"),
        ({"name": "x", "expires_in_days": True}, 422, "expires_in_days"),
        ({"name": "x", "colour": "red"}, 422, "colour"),
        ({"name": "x" * 65}, 422, "name"),
        ({"name": "a\nb"}, 422, "name"),
        ({"name": 'x"} 1'}, 422, "name"),
        ({"name": "x", "models": [""]}, 422, "models"),
        ({"name": "x", "models": ["a,b"]}, 422, "models"),
        ({"name": "x", "models": ["a b"]}, 422, "models"),
        ({"name": "x", "models": ["m", "a\u0000b"]}, 422, "models"),
        ({"name": "x", "models": []}, 422, "models"),
        ({"name": "x", "models": [7]}, 422, "models"),
        ({"name": "x", "models": ["m" * 257]}, 422, "models"),
        ({"name": "x", "models": [f"m{i}" for i in range(257)]}, 422, "models"),
        ({"name": "x", "rpm": 10**9 + 1}, 422, "rpm"),
        ({"name": "x", "rpm": True}, 422, "rpm"),
        ({"name": "x", "tpm": 10**12 + 1}, 422, "tpm"),
        ({"name": "x", "tpm": 10**30}, 422, "tpm"),
        ({"name": "x", "max_concurrency": 0}, 422, "max_concurrency"),
        ({"name": "x", "max_concurrency": 100_001}, 422, "max_concurrency"),
        ({"name": "x", "max_concurrency": "4"}, 422, "max_concurrency"),
        ({"name": "x", "max_concurrency": 1.5}, 422, "max_concurrency"),
        ({"name": "unified"}, 400, "name"),
        ([1, 2], 400, None),
    ],
)
def test_bad_create_bodies(gateway, body, status, param) -> None:
    got, answer = call(gateway.url + "/admin/keys", ADMIN, body)
    assert got == status and is_error(answer, status, param=param), answer
    assert call(gateway.url + "/admin/keys", ADMIN)[1]["data"] == []  # nothing stored


def raw_post(url: str, data: bytes, chunked: bool = False) -> tuple[int, dict[str, object]]:
    """POST bytes as they are (NaN, deep nesting, a large body; chunked: no Content-Length)."""
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=10)
    headers = {"Authorization": f"Bearer {ADMIN}", "Content-Type": "application/json"}
    try:
        if chunked:
            conn.request("POST", parts.path, iter([data[i : i + 8192] for i in range(0, len(data), 8192)]), headers,
                         encode_chunked=True)  # fmt: skip
        else:
            conn.request("POST", parts.path, data, headers)
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


@pytest.mark.parametrize(
    ("data", "chunked", "status", "code"),
    [
        (b'{"name": "x", "rpm": NaN}', False, 400, "invalid_json"),
        (b'{"name": "x", "expires_in_days": Infinity}', False, 400, "invalid_json"),
        (b"[" * 60_000 + b"]" * 60_000, False, 400, "invalid_json"),  # deeper than the parser's stack
        (b'{"name": "x", "rpm": 1' + b"0" * 5000 + b"}", False, 400, "invalid_json"),
        (b'{"name": "big", "models": ["' + b"m" * 200_000 + b'"]}', False, 413, "request_too_large"),
        (b'{"name": "big", "models": ["' + b"m" * 200_000 + b'"]}', True, 413, "request_too_large"),
    ],
    ids=["nan", "infinity", "deep", "huge-int", "large", "large-chunked"],
)
def test_bodies_that_are_no_key(gateway, data, chunked, status, code) -> None:
    got, answer = raw_post(gateway.url + "/admin/keys", data, chunked)
    assert got == status and is_error(answer, status, code=code), answer
    assert call(gateway.url + "/admin/keys", ADMIN)[1]["data"] == []


def test_max_concurrency_and_allow_list_round_trip(gateway) -> None:
    longest = [f"model-{i:03}-" + "x" * 246 for i in range(256)]  # the most key_fields allows: within the body limit
    for body in ({"name": "capped", "models": ["m", "org/model:v1.5"], "max_concurrency": 4},
                 {"name": "free"}, {"name": "widest", "models": longest, "max_concurrency": 100_000}):  # fmt: skip
        status, made = call(gateway.url + "/admin/keys", ADMIN, body)
        assert status == 201, made
        assert (made["models"], made["max_concurrency"]) == (body.get("models"), body.get("max_concurrency"))
    listed = {k["name"]: k for k in call(gateway.url + "/admin/keys", ADMIN)[1]["data"]}
    assert listed["capped"]["max_concurrency"] == 4 and listed["capped"]["models"] == ["m", "org/model:v1.5"]
    assert listed["free"]["max_concurrency"] is None and listed["free"]["models"] is None
    assert listed["widest"]["models"] == longest


def test_not_json_duplicate_unknown_and_wrong_keys(gateway) -> None:
    base = gateway.url
    req = urllib.request.Request(base + "/admin/keys", b"{not json", {"Authorization": f"Bearer {ADMIN}"})
    try:
        urllib.request.urlopen(req, timeout=10)
        raise AssertionError("accepted a body that is not JSON")
    except urllib.error.HTTPError as exc:
        assert exc.code == 400 and b"not valid JSON" in exc.read()
    assert call(base + "/admin/keys", ADMIN, {"name": "dup"})[0] == 201
    status, answer = call(base + "/admin/keys", ADMIN, {"name": "dup"})
    assert status == 409 and is_error(answer, 409, "key_exists", "name")
    status, answer = call(base + "/admin/keys/nobody", ADMIN, method="DELETE")
    assert status == 404 and is_error(answer, 404, "key_not_found", "name")
    for key in (None, "wrong", ADMIN + "x", "unified-secret-123"):  # the unified key is no admin key
        for path, method in (("/admin/keys", "GET"), ("/admin/usage", "GET"), ("/admin/keys/dup", "DELETE")):
            status, answer = call(base + path, key, method=method)
            assert status == 401 and is_error(answer, 401, "invalid_api_key"), (key, path)
    assert call(base + "/admin/keys", ADMIN)[1]["data"][0]["revoked"] is False


def test_admin_api_is_absent_without_admin_key(tmp_path) -> None:
    with UpstreamServer(model="m") as up, GatewayServer(make_config(tmp_path, [("b0", up.url, "m")])) as gs:
        for path, method in (("/admin/keys", "GET"), ("/admin/usage", "GET"), ("/admin/keys/x", "DELETE")):
            status, answer = call(gs.url + path, ADMIN, method=method)
            assert status == 404 and is_error(answer, 404)


def test_keys_cli_through_the_admin_api(gateway, clean_env) -> None:
    env = {**clean_env, "ZEROGAP_ADMIN_KEY": ADMIN}

    def keys(*args: str, environ: dict[str, str] = env) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(zerogap_cmd("keys", "--url", gateway.url, *args), capture_output=True, env=environ,
                              timeout=30)  # fmt: skip

    created = keys("create", "--name", "remote", "--tpm", "5000")
    secret = created.stdout.decode().strip()
    assert created.returncode == 0 and secret.startswith("zg-"), created.stderr
    assert chat(gateway.url, secret)[0] == 200
    listed = keys("list").stdout.decode()
    assert "remote" in listed and "active" in listed and "5000" in listed and secret not in listed
    dup = keys("create", "--name", "remote")
    assert dup.returncode == 2 and b"exists already" in dup.stderr and b"Traceback" not in dup.stderr
    assert keys("revoke", "remote").returncode == 0 and "revoked" in keys("list").stdout.decode()
    assert keys("revoke", "nobody").returncode == 1
    capped = keys("create", "--name", "capped", "--max-concurrency", "7", "--models", "m, other")
    assert capped.returncode == 0, capped.stderr
    line = next(x for x in keys("list").stdout.decode().splitlines() if x.startswith("capped "))
    assert line.split()[2:6] == ["m,other", "-", "-", "7"]  # MODELS RPM TPM MAXCONC
    made = {k["name"]: k for k in call(gateway.url + "/admin/keys", ADMIN)[1]["data"]}["capped"]
    assert made["max_concurrency"] == 7 and made["models"] == ["m", "other"]
    for bad, field in ((["--models", "m,,x"], b"models"), (["--models", ""], b"models"),
                       (["--models", "a b"], b"models"), (["--max-concurrency", "100001"], b"max_concurrency"),
                       (["--tpm", str(10**13)], b"tpm")):  # fmt: skip
        refused = keys("create", "--name", "refused", *bad)
        assert refused.returncode == 2 and field + b":" in refused.stderr and b"Traceback" not in refused.stderr
    assert "refused" not in str(call(gateway.url + "/admin/keys", ADMIN)[1])
    no_key = keys("list", environ=clean_env)
    assert no_key.returncode == 2 and b"ZEROGAP_ADMIN_KEY" in no_key.stderr
    wrong = keys("list", environ={**clean_env, "ZEROGAP_ADMIN_KEY": "nope"})
    assert wrong.returncode == 2 and b"401" in wrong.stderr and b"nope" not in wrong.stderr
