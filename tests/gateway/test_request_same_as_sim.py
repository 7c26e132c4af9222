"""One body, one message: a request that breaks a rule of common/openai_request.py gets the same 400
(message and param) from a real gateway and from a real simulated engine, each in its own shape
(the gateway's invalid_request_error, the engine's vLLM-shaped BadRequestError). The gateway
serves the sim, so the pair is also what a client of the gateway sees."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from backends.sim.testing import SimProcess, run_sim_process
from tests.gateway.helpers import GatewayServer, auth, error_of, make_config, post

MODEL = "sim-m"
CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
MSG = [{"role": "user", "content": "one two"}]
REQUIRED = "'model' is required: the name of a model from GET /v1/models"
TOKENS = "integers 0 to 2147483647"

CASES = [
    # (path, body, param, the message both give)
    (CHAT, {"messages": MSG, "model": 5}, "model", f"{REQUIRED} (got 5)."),
    (CHAT, {"messages": MSG, "model": ""}, "model", f"{REQUIRED} (got '')."),
    (CHAT, {"messages": MSG, "model": "m" * 257}, "model", "'model' is longer than 256 characters: see GET /v1/models"),
    (CHAT, {"model": MODEL, "messages": MSG, "stream": "on"}, "stream", "'stream' must be true or false (got a string"),
    (
        CHAT,
        {"model": MODEL, "messages": MSG, "stream": True, "stream_options": 1},
        "stream_options",
        "'stream_options' must be an object, such as {\"include_usage\": true} (got 1).",
    ),
    (
        COMPLETIONS,
        {"model": MODEL, "prompt": "x", "stream": True, "stream_options": {"include_usage": 1}},
        "stream_options.include_usage",
        "'stream_options.include_usage' must be true or false (got 1).",
    ),
    (
        COMPLETIONS,
        {"model": MODEL, "prompt": "x", "stream": True, "stream_options": {"continuous_usage_stats": "y"}},
        "stream_options.continuous_usage_stats",
        "'stream_options.continuous_usage_stats' must be true or false (got a string).",
    ),
    (
        CHAT,
        {"model": MODEL, "messages": []},
        "messages",
        '\'messages\' is required: a non-empty list of {"role", "content"} objects.',
    ),
    (
        CHAT,
        {"model": MODEL, "messages": [*MSG, {"content": "x"}]},
        "messages",
        '\'messages[1]\' must be an object with a string \'role\', such as {"role": "user", "content": "Hello"}.',
    ),
    (
        COMPLETIONS,
        {"model": MODEL},
        "prompt",
        "'prompt' is required: a string, a non-empty list of strings, or a non-empty list of token ids "
        f"({TOKENS}), or a list of such lists.",
    ),
    (COMPLETIONS, {"model": MODEL, "prompt": [1, -1]}, "prompt", TOKENS),
    (COMPLETIONS, {"model": MODEL, "prompt": [1, 2**31]}, "prompt", TOKENS),
    (COMPLETIONS, {"model": MODEL, "prompt": [[1], []]}, "prompt", TOKENS),
    (COMPLETIONS, {"model": MODEL, "prompt": ["a", 1]}, "prompt", TOKENS),
    (
        COMPLETIONS,
        {"model": MODEL, "prompt": "x", "max_tokens": 0},
        "max_tokens",
        "'max_tokens' must be a positive integer (got 0).",
    ),
    (
        CHAT,
        {"model": MODEL, "messages": MSG, "max_tokens": "9"},
        "max_tokens",
        "'max_tokens' must be a positive integer (got a string).",
    ),
    (
        CHAT,
        {"model": MODEL, "messages": MSG, "max_tokens": 2**31},
        "max_tokens",
        "'max_tokens' must be at most 2147483647 (got 2147483648).",
    ),
    (
        CHAT,
        {"model": MODEL, "messages": MSG, "max_completion_tokens": 1.5},
        "max_completion_tokens",
        "'max_completion_tokens' must be a positive integer (got 1.5).",
    ),
    (CHAT, {"model": MODEL, "messages": MSG, "n": 0}, "n", "'n' must be a positive integer (got 0)."),
    (CHAT, {"model": MODEL, "messages": MSG, "n": 129}, "n", "'n' must be at most 128 (got 129)."),
    # bodies that are not a JSON object, sent as these bytes
    (
        CHAT,
        b'{"model": "sim-m",',
        None,
        "The body is not valid JSON (Expecting property name enclosed in double quotes",
    ),
    (COMPLETIONS, b"[1, 2]", None, "The body must be a JSON object."),
    (COMPLETIONS, b'"prompt"', None, "The body must be a JSON object."),
    (CHAT, b'{"model": "sim-\xff"}', None, "The body is not valid UTF-8 (byte 15). Send JSON encoded as UTF-8."),
]


@pytest.fixture(scope="module")
def sim() -> Iterator[SimProcess]:
    with run_sim_process("--time-scale", "1", model=MODEL) as process:
        yield process


@pytest.fixture(scope="module")
def gateway(sim: SimProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayServer]:
    config = make_config(tmp_path_factory.mktemp("same-as-sim"), [("sim", sim.url, MODEL)])
    with GatewayServer(config) as server:
        yield server


async def post_bytes(url: str, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    sent = {"Content-Type": "application/json", **(headers or {})}
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as s,
        s.post(url, data=body, headers=sent) as resp,
    ):
        return resp.status, await resp.read()


async def refusal(url: str, body: dict[str, Any] | bytes, headers: dict[str, str] | None = None) -> dict[str, Any]:
    if isinstance(body, bytes):
        status, raw = await post_bytes(url, body, headers)
    else:
        status, _, raw = await post(url, body, headers)
    assert status == 400, raw
    return error_of(raw)


@pytest.mark.parametrize(("path", "body", "param", "message"), CASES, ids=[f"{i}-{c[2]}" for i, c in enumerate(CASES)])
async def test_the_gateway_and_the_sim_refuse_a_body_with_the_same_message(
    sim, gateway, path, body, param, message
) -> None:
    at_gateway = await refusal(gateway.url + path, body, auth())
    at_sim = await refusal(sim.url + path, body)
    shape = (param, "invalid_request_error", "invalid_value")
    assert (at_gateway["param"], at_gateway["type"], at_gateway["code"]) == shape
    assert (at_sim["param"], at_sim["type"], at_sim["code"]) == (param, "BadRequestError", 400)
    assert at_gateway["message"] == at_sim["message"]
    assert message in at_sim["message"], at_sim["message"]


async def test_the_pair_is_wired_and_a_rule_of_the_sims_own_comes_back_through_the_gateway(sim, gateway) -> None:
    body = {"model": MODEL, "messages": MSG, "max_tokens": 2, "stream": False}
    status, _, raw = await post(gateway.url + CHAT, body, auth())
    assert status == 200, raw
    # token id 32000 is valid OpenAI (the gateway passes it), but past the sim's vocabulary: its own 400
    ids = {"model": MODEL, "prompt": [1, 32000], "max_tokens": 2}
    at_gateway = await refusal(gateway.url + COMPLETIONS, ids, auth())
    at_sim = await refusal(sim.url + COMPLETIONS, ids)
    assert at_sim["param"] == "prompt" and "ids are 0 to 31999" in at_sim["message"]
    assert at_gateway["message"] == at_sim["message"]
