"""POST /tokenize and /detokenize through the gateway, to a real simulated engine: the count is
the one the engine charges as usage.prompt_tokens, the client's key stays at the gateway, and
the key's allow-list and rpm hold as for completions."""

from __future__ import annotations

import json

import aiohttp

from backends.sim.testing import run_sim_process
from gateway.tenants.keys.base import KeyLimits
from gateway.tenants.keys.sqlite import KeyStore
from tests.fixtures.upstream import Behavior, UpstreamServer
from tests.gateway.helpers import GatewayServer, auth, error_of, make_config, post

PROMPT = "the quick brown fox jumps over the lazy dog " * 5


async def test_tokenize_counts_what_the_engine_charges(tmp_path) -> None:
    with run_sim_process(model="served-name") as sim:
        extra = f'\n[[backends]]\nname = "sim"\nurl = "{sim.url}"\nmodel = "m"\nupstream_model = "served-name"\n'
        with GatewayServer(make_config(tmp_path, [], extra=extra)) as gs:
            for path in ("/tokenize", "/api/tokenize"):
                status, _, raw = await post(gs.url + path, {"model": "m", "prompt": PROMPT}, auth())
                assert status == 200, raw
                counted = json.loads(raw)
                assert counted["count"] == len(counted["tokens"]) > 0
            status, _, raw = await post(gs.url + "/detokenize", {"model": "m", "tokens": counted["tokens"]}, auth())
            assert status == 200 and json.loads(raw)["prompt"].split() == PROMPT.split(), raw
            body = {"model": "m", "prompt": PROMPT, "max_tokens": 1, "stream": False}
            status, _, raw = await post(gs.url + "/v1/completions", body, auth())
            assert status == 200 and json.loads(raw)["usage"]["prompt_tokens"] == counted["count"], raw


async def test_tokenize_is_guarded_like_a_completion(tmp_path) -> None:
    with UpstreamServer(Behavior(api_key="backend-secret-key"), model="m") as up:
        extra = f'\n[[backends]]\nname = "b"\nurl = "{up.url}"\nmodel = "m"\napi_key = "backend-secret-key"\n'
        config = make_config(tmp_path, [], extra=extra)
        store = KeyStore(config.resolve_path(config.gateway.key_store))
        other = store.create("other", models=["elsewhere"])
        limited = store.create("limited", limits=KeyLimits(rpm=2))
        store.close()
        with GatewayServer(config) as gs:
            status, _, raw = await post(gs.url + "/tokenize", {"model": "m", "prompt": "hi"}, {})
            assert status == 401, raw
            status, _, raw = await post(gs.url + "/tokenize", {"model": "m", "prompt": "hi"}, auth(other))
            assert status == 404 and error_of(raw)["code"] == "model_not_found", raw  # as for a model not there
            status, _, raw = await post(gs.url + "/tokenize", {"model": "nope", "prompt": "hi"}, auth())
            assert status == 404 and error_of(raw)["code"] == "model_not_found", raw
            status, _, raw = await post(gs.url + "/tokenize", {"prompt": "hi"}, auth())
            assert status == 400 and error_of(raw)["param"] == "model", raw
            status, _, raw = await post(gs.url + "/tokenize", {"model": "m" * 10_000, "prompt": "hi"}, auth())
            assert status == 400 and error_of(raw)["param"] == "model" and len(raw) < 1000, raw[:300]
            async with (
                aiohttp.ClientSession() as session,
                session.post(
                    gs.url + "/tokenize", data=b'{"model": "m"}', headers={**auth(), "Content-Type": "text/plain"}
                ) as resp,
            ):
                assert resp.status == 415, await resp.read()
            async with (
                aiohttp.ClientSession() as session,
                session.post(
                    gs.url + "/tokenize", data=b"{not json", headers={**auth(), "Content-Type": "application/json"}
                ) as resp,
            ):
                assert resp.status == 400 and error_of(await resp.read())["type"] == "invalid_request_error"
            statuses = [(await post(gs.url + "/tokenize", {"model": "m", "prompt": "hi"}, auth(limited)))[0]
                        for _ in range(3)]  # fmt: skip
            assert statuses == [200, 200, 429], statuses
    # the upstream answers /tokenize only to its own api_key: the 200s above carried it, not the client's
