"""[server], [gateway] and [[backends]]: what the gateway needs."""

from __future__ import annotations

import ipaddress
from typing import Literal

from pydantic import Field, HttpUrl, field_validator, model_validator

from common.config.base import Section
from common.config.routing import CacheAwareSection, RoutingName
from common.config.zmq_endpoint import check_zmq_endpoint

MIN_SECRET_CHARS = 16
DEFAULT_MAX_CONNECTIONS_PER_CLIENT = 1024  # the load test (256 streams, scrapes) and the soak (512) from one host fit
# body fields the gateway reads itself (gateway/request.py): drop_body_fields may not name them
GATEWAY_READS = frozenset({"model", "messages", "prompt", "stream", "stream_options", "max_tokens",
                           "max_completion_tokens", "n", "best_of"})  # fmt: skip


class ServerSection(Section):
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=1, le=65535)
    api_key: str = Field("", description="the unified key clients send as Bearer; may be ${TAOTOKEN_API_KEY}")
    base_url: str = Field("http://127.0.0.1:8000/api", description="clients call {base_url}/v1/...")
    admin_key: str = Field("", description="enables the admin API (/admin/...) for this Bearer key; may be ${VAR}")
    metrics_key: str = Field(
        "", description="when set, GET /metrics and the backend detail of GET /ready need this Bearer key"
    )
    max_header_bytes: int = Field(
        32 * 1024, ge=1024, le=1024 * 1024, description="request line + headers; larger: 431 and the connection closed"
    )
    header_timeout_s: float = Field(30.0, gt=0, description="a request's headers must be complete within this long")
    body_timeout_s: float = Field(60.0, gt=0, description="a request's body must be complete within this long (408)")
    max_connections: int = Field(
        10_000, ge=1, description="open client connections per gateway process; beyond it: 503"
    )
    max_connections_per_client: int = Field(
        DEFAULT_MAX_CONNECTIONS_PER_CLIENT,
        ge=1,
        description="open connections of one client address (IPv6: its /64) per gateway process; beyond it the "
        "new connection gets 503 at once; at most max_connections (default: 1024, or max_connections if lower)",
    )
    idle_connection_timeout_s: float = Field(
        10.0,
        gt=0,
        description="a connection that sends no request within this long (new, or kept alive between requests) "
        "is closed",
    )
    forwarded_allow_ips: list[str] = Field(
        default_factory=list,
        description='proxies (addresses or CIDR networks, or "*") whose X-Forwarded-For names the client; '
        "default none: the client is the socket's address",
    )

    @field_validator("base_url")
    @classmethod
    def _url(cls, value: str) -> str:
        HttpUrl(value)  # raises with a clear message on a bad URL
        return value

    @field_validator("forwarded_allow_ips")
    @classmethod
    def _addresses(cls, value: list[str]) -> list[str]:
        for entry in value:
            try:
                if entry.strip() != "*":
                    ipaddress.ip_network(entry.strip(), strict=False)
            except ValueError:
                raise ValueError(f'{entry!r} is not an IP address, a network (CIDR, e.g. 10.0.0.0/8) or "*"') from None
        return [entry.strip() for entry in value]

    @field_validator("api_key", "admin_key", "metrics_key")
    @classmethod
    def _long_enough(cls, value: str) -> str:
        if value and len(value) < MIN_SECRET_CHARS:
            raise ValueError(
                f"must be at least {MIN_SECRET_CHARS} characters (got {len(value)}); "
                "make one with: python -c 'import secrets; print(secrets.token_urlsafe(32))'"
            )
        return value

    @model_validator(mode="after")
    def _per_client(self) -> ServerSection:
        if self.max_connections_per_client > self.max_connections:
            if "max_connections_per_client" not in self.model_fields_set:  # the default follows a lower max
                self.max_connections_per_client = self.max_connections
            else:
                raise ValueError(
                    f"max_connections_per_client ({self.max_connections_per_client}) must be at most "
                    f"max_connections ({self.max_connections}): one client may not hold more than every client"
                )
        return self

    @model_validator(mode="after")
    def _distinct(self) -> ServerSection:
        if self.admin_key and self.admin_key == self.api_key:
            raise ValueError("admin_key must differ from api_key (the admin key manages every tenant's keys)")
        if self.metrics_key and self.metrics_key in (self.api_key, self.admin_key):
            raise ValueError("metrics_key must differ from api_key and admin_key")
        return self


class GatewaySection(Section):
    routing: RoutingName = "least_load"
    cache_aware: CacheAwareSection = Field(default_factory=CacheAwareSection)
    key_store: str = Field(
        "zerogap-keys.db", description="SQLite file of virtual keys and usage; relative to config.toml"
    )
    connect_timeout_s: float = Field(5.0, gt=0)
    first_byte_timeout_s: float = Field(600.0, gt=0)
    idle_timeout_s: float = Field(300.0, gt=0, description="longest gap between two upstream chunks")
    keepalive_interval_s: float = Field(10.0, gt=0, description="SSE comment while the first token is on its way")
    max_body_bytes: int = Field(4 * 1024 * 1024, ge=1024)
    max_retries: int = Field(2, ge=0, le=10)
    health_interval_s: float = Field(2.0, gt=0)
    load_scrape_interval_s: float = Field(1.0, gt=0)
    key_refresh_interval_s: float = Field(0.5, gt=0)
    usage_flush_interval_s: float = Field(1.0, gt=0)
    max_connections_per_backend: int = Field(0, ge=0, description="0 = unlimited")
    redis_url: str | None = Field(
        None, description="redis://host:port/db: rate limits shared by every gateway process using it"
    )
    eject_grace_s: float = Field(
        5.0, ge=0, description="a stream from a backend that left the pool ends after this long without a byte"
    )
    outlier_consecutive_errors: int = Field(
        5,
        ge=0,
        description="connect errors, connections closed before an answer or 5xx answers (once served elsewhere),"
        " in a row, that eject a backend at once (Envoy's consecutive_5xx; streams that break after their 200"
        " count in the rates only); 0 = off",
    )
    outlier_base_ejection_s: float = Field(
        30.0, gt=0, description="first ejection's length; each repeat doubles it (up to outlier_max_ejection_s)"
    )
    outlier_max_ejection_s: float = Field(300.0, gt=0, description="the longest ejection")
    outlier_interval_s: float = Field(
        10.0, gt=0, description="each model's backends are judged on their failure rates this often"
    )
    outlier_min_requests: int = Field(
        20, ge=1, description="requests a backend must end in an interval for its failure rate to be judged"
    )
    outlier_success_rate_stdev_factor: float = Field(
        4.0,
        gt=0,
        description="eject a backend whose success rate is below its peers' by this many times the spread"
        " (the larger of the peers' standard deviation and the binomial noise of its own rate)",
    )
    outlier_failure_percentage_threshold: float = Field(
        50.0,
        gt=0,
        le=100,
        description="eject a backend whose failure share is at least this (in %) while its peers' is below",
    )
    max_ejection_percent: float = Field(
        50.0, ge=0, le=100, description="at most this share of a model's backends out by the outlier rules at once"
    )
    unhealthy_threshold: int = Field(3, ge=1, description="failed health checks in a row that take a backend out")
    healthy_threshold: int = Field(2, ge=1, description="passed health checks in a row that bring it back")
    panic_routing: bool = Field(
        True,
        description="while no backend of a model passes its health check, send its requests to all of them"
        " (one that is down refuses them, and the client gets 503) rather than answer 503 at once",
    )
    drain_timeout_s: float = Field(
        30.0, ge=0, description="on SIGTERM, streams in flight may finish for this long; the rest then end"
    )

    database_url: str | None = Field(
        None, description="postgresql://user@host:port/db: keys and usage shared by every gateway process"
    )

    default_max_tokens: int = Field(
        4096,
        ge=1,
        description="completion tokens reserved when a request names no max_tokens"
        " (and sent upstream as its max_tokens while max_tokens_limit is set)",
    )
    max_tokens_limit: int | None = Field(
        None, ge=1, description="a request asking for more completion tokens than this gets 400; absent: no limit"
    )
    continue_streams: bool = Field(
        True,
        description="a one-choice stream that breaks after its first token is continued on another backend"
        " (from the text relayed so far) instead of ending with an error event",
    )
    max_choices: int = Field(
        128,
        ge=1,
        le=100_000,
        description="completions one request may ask for: n (or best_of) x the prompts of a list; more is a 400",
    )
    drop_body_fields: list[str] = Field(
        default_factory=lambda: ["priority"],
        description="request body fields removed before the request goes upstream (priority: vLLM's queue order)",
    )
    on_store_down: Literal["serve_cached", "refuse"] = Field(
        "serve_cached",
        description="key store unreachable: keep serving the keys loaded before, or refuse virtual keys (503)",
    )
    on_redis_down: Literal["local", "refuse"] = Field(
        "local", description="Redis unreachable: count limits in this process only, or refuse limited keys (503)"
    )
    concurrency_lease_s: float = Field(
        5.0, gt=0, le=300, description="a concurrency slot held by a process that died is freed after this long"
    )
    auth_failures_limit: int = Field(
        20,
        ge=0,
        description="failed authentications from one client address within auth_failure_window_s "
        "before it gets 429 for that long; 0 = off",
    )
    auth_failure_window_s: float = Field(10.0, gt=0)

    @field_validator("drop_body_fields")
    @classmethod
    def _droppable(cls, value: list[str]) -> list[str]:
        kept = sorted(GATEWAY_READS.intersection(value))
        if kept:
            raise ValueError(f"the gateway reads {', '.join(kept)} itself; they cannot be dropped")
        return value

    @field_validator("database_url")
    @classmethod
    def _database(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("postgresql://", "postgres://")):
            raise ValueError("must start with postgresql:// (or postgres://)")
        return value

    @field_validator("redis_url")
    @classmethod
    def _redis(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("must start with redis://, rediss:// or unix://")
        return value


class BackendEntry(Section):
    name: str = Field(min_length=1)
    url: str
    model: str = Field(min_length=1, description="the name clients ask for")
    api_key: str | None = Field(None, description="sent upstream instead of the client's key")
    upstream_model: str | None = Field(None, description="the name the backend serves, if it differs")
    weight: int = Field(1, ge=1)
    kv_events_endpoint: str | None = Field(
        None,
        description="routing = 'kv_events': the engine's KV-event publisher to subscribe to (vLLM's "
        "--kv-events-config endpoint, or [sim] kv_events_endpoint), as the gateway reaches it: tcp://HOST:PORT",
    )
    kv_events_replay_endpoint: str | None = Field(
        None, description="its replay socket: missed batches are asked for again (and its buffer read at start)"
    )
    kv_events_topic: str = Field("", description="the topic the engine publishes under")

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        HttpUrl(value)
        return value.rstrip("/")

    @field_validator("kv_events_endpoint", "kv_events_replay_endpoint")
    @classmethod
    def _zmq(cls, value: str | None) -> str | None:
        return None if value is None else check_zmq_endpoint(value, bind=False)
