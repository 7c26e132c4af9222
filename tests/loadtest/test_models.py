"""workload.model absent: the only model GET /v1/models lists, else a stop that lists them."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from loadgen.models import ModelChoiceError, choose_model
from zerogap.net import free_port


@contextmanager
def models_server(ids: list[str], status: int = 200) -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = (
                {"data": [{"id": i, "object": "model"} for i in ids]}
                if status == 200
                else {"error": {"message": "Invalid API key", "type": "auth", "param": None, "code": "invalid_api_key"}}
            )
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/api"
    finally:
        server.shutdown()
        server.server_close()


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
