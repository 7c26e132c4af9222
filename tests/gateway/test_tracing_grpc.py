"""[observability] otlp_protocol = "grpc": a real gateway exports its spans over OTLP/gRPC (the SDK's gRPC
exporter, as to a collector's port 4317) to a test gRPC receiver: a streamed request's spans in the
client's trace, with its attributes, and otlp_headers sent as the export's metadata."""

from __future__ import annotations

from tests.fixtures.otlp_grpc import OtlpGrpcReceiver
from tests.fixtures.upstream import Behavior, UpstreamServer
from tests.gateway.helpers import GatewayServer, auth, chat_body, events, make_config
from tests.gateway.test_tracing import ADMIN, CLIENT_SPAN, CLIENT_TRACE, by_name, flushed, header, post


async def test_spans_go_over_grpc_with_the_configured_headers(tmp_path) -> None:
    with (
        OtlpGrpcReceiver() as otlp,
        UpstreamServer(Behavior(num_output_tokens=3), model="m") as up,
    ):
        extra = (
            f'[observability]\notlp_endpoint = "{otlp.url}"\notlp_protocol = "grpc"\nservice_name = "gw-grpc"\n'
            'otlp_headers = { authorization = "Bearer collector-token-1" }\n'
        )
        config = make_config(tmp_path, [("b0", up.url, "m")], extra=extra, admin_key=ADMIN)
        with GatewayServer(config) as gs:
            headers = {**auth(), "traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"}
            status, _, raw = await post(gs.url + "/v1/chat/completions", chat_body(), headers)
            assert status == 200 and events(raw)[-1] == "[DONE]"
            spans = await flushed(gs, otlp, CLIENT_TRACE, 9)
        (seen,) = up.requests
    named = by_name(spans)
    (root,) = named["chat m"]
    assert root.service == "gw-grpc" and root.parent_id == CLIENT_SPAN and root.kind == "server"
    assert root.attributes["gen_ai.usage.output_tokens"] == 3 and root.attributes["zerogap.key.name"] == "unified"
    assert {s.name for s in spans} == {"chat m", "admission", "auth", "limits", "body", "route", "upstream",
                                       "first_byte", "stream"}  # fmt: skip
    (upstream,) = named["upstream"]
    assert header(seen.headers, "traceparent") == f"00-{CLIENT_TRACE}-{upstream.span_id}-01"
    assert otlp.metadata and all(m.get("authorization") == "Bearer collector-token-1" for m in otlp.metadata)
