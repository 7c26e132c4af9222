"""[observability] (OpenTelemetry traces over OTLP) and the request log's settings of [logging]."""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator

from common.config.base import Section

REQUEST_LOG_OFF = "off"
REQUEST_LOG_STDOUT = "stdout"


class ObservabilitySection(Section):
    otlp_endpoint: str = Field(
        "",
        description="where spans go, e.g. http://127.0.0.1:4318 (http/protobuf; /v1/traces is added to a bare "
        "address) or http://127.0.0.1:4317 (grpc); empty: no traces, nothing on the request path",
    )
    otlp_protocol: Literal["http/protobuf", "grpc"] = "http/protobuf"
    sample_ratio: float = Field(
        1.0, ge=0.0, le=1.0, description="share of new traces kept (by trace id); a continued trace keeps its own"
    )
    service_name: str = Field("zerogap-gateway", min_length=1, max_length=128)
    continue_client_trace: bool = Field(
        True, description="a client's W3C traceparent is continued (its trace id, its sampling); false: a new trace"
    )
    otlp_headers: dict[str, str] = Field(
        default_factory=dict, description="sent with every export (e.g. a collector's auth token, ${VAR})"
    )
    export_timeout_s: float = Field(10.0, gt=0, le=300)

    @field_validator("otlp_endpoint")
    @classmethod
    def _endpoint(cls, value: str) -> str:
        if value and (urlsplit(value).scheme not in ("http", "https") or not urlsplit(value).hostname):
            raise ValueError("must be an http:// or https:// URL (empty: tracing off)")
        return value

    @property
    def enabled(self) -> bool:
        return bool(self.otlp_endpoint)

    def traces_url(self) -> str:
        """The URL the exporter posts to: http/protobuf wants /v1/traces, added when no path is given."""
        if self.otlp_protocol == "http/protobuf" and urlsplit(self.otlp_endpoint).path in ("", "/"):
            return self.otlp_endpoint.rstrip("/") + "/v1/traces"
        return self.otlp_endpoint


def check_request_log(value: str) -> str:
    """[logging].request_log: "off", "stdout" or a file's path."""
    if not value.strip():
        raise ValueError('must be "off", "stdout" or a file path')
    return value
