"""workload.model absent: the only model GET /v1/models lists, else a stop that lists them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from common.net import free_port
from loadgen.models import ModelChoiceError, choose_model
from tests.support import QuietHandler, serving


@contextmanager
def models_server(ids: list[str], status: int = 200) -> Iterator[str]:
    class Handler(QuietHandler):
        def do_GET(self) -> None:
            body = (
                {"data": [{"id": i, "object": "model"} for i in ids]}
                if status == 200
                else {"error": {"message": "Invalid API key", "type": "auth", "param": None, "code": "invalid_api_key"}}
            )
            self.reply(status, json.dumps(body).encode())

    with serving(Handler) as url:
        yield url + "/api"


def test_the_only_model_is_chosen() -> None:
    with models_server(["tiny-llama"]) as url:
        assert choose_model(url, {}, 2.0) == "tiny-llama"


def test_several_models_stop_with_the_list() -> None:
    with models_server(["a-model", "b-model"]) as url, pytest.raises(ModelChoiceError) as caught:
        choose_model(url, {}, 2.0)
    assert "lists 2: a-model, b-model" in str(caught.value) and '"model": "a-model"' in str(caught.value)


def test_refused_listing_says_status_and_message() -> None:
    with models_server([], status=401) as url, pytest.raises(ModelChoiceError) as caught:
        choose_model(url, {}, 2.0)
    assert caught.value.kind == "HTTP 401" and "Invalid API key" in str(caught.value)
    with pytest.raises(ModelChoiceError) as refused:
        choose_model(f"http://127.0.0.1:{free_port()}/api", {}, 2.0)
    assert refused.value.kind == "connection error"
