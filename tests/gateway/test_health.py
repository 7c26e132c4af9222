"""gateway/health.py: the load a backend reports on its /metrics."""

from __future__ import annotations

from gateway.health import parse_queue


def test_parse_queue() -> None:
    text = (
        b"# TYPE vllm:num_requests_running gauge\n"
        b'vllm:num_requests_running{model_name="a"} 3.0\n'
        b'vllm:num_requests_waiting{model_name="a"} 4.0\n'
        b"vllm:num_requests_waiting_by_reason 9\n"
    )
    assert parse_queue(text) == 7
    assert parse_queue(b"garbage\nvllm:num_requests_running x") == 0
