"""deploy/compose, the secrets: each one required from the user's environment (no default
password), vLLM started with the key the gateway sends upstream, Redis with the password in
redis_url, Prometheus sending the metrics key from a compose secret, and no store or engine
publishing a port on the host."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

import pytest

from common.config.loader import ConfigError, load_config
from tests.deploy.paths import COMPOSE, load_yaml
from tests.deploy.secrets import COMPOSE_ENV as ENV

REQUIRED = {"TAOTOKEN_API_KEY", "ZEROGAP_METRICS_KEY", "VLLM_API_KEY", "REDIS_PASSWORD", "POSTGRES_PASSWORD"}
_REFERENCE = re.compile(r"\$\{([A-Z_]+)(:[-?][^}]*)?\}")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    doc: dict[str, Any] = load_yaml(COMPOSE)
    return doc


def references(text: str) -> dict[str, set[str]]:
    """VAR -> the forms ${VAR...} takes in the text ('' plain, ':-...' default, ':?...' required)."""
    found: dict[str, set[str]] = {}
    for name, rest in _REFERENCE.findall(text):
        found.setdefault(name, set()).add(rest[:2])
    return found


def test_every_secret_is_required_without_a_default() -> None:
    """A secret with a default (the old POSTGRES_PASSWORD=zerogap) is a password everyone knows."""
    used = references(COMPOSE.read_text())
    for name in REQUIRED:
        assert used[name] == {":?"}, f"{name}: {used[name]}"
    assert used["ZEROGAP_ADMIN_KEY"] == {":-"}, "optional: empty turns the admin API off"


def test_gateway_config_needs_each_secret() -> None:
    path = COMPOSE.parent / "config.toml"
    config = load_config(path, env=ENV)
    assert config.server.metrics_key == ENV["ZEROGAP_METRICS_KEY"]
    assert {b.api_key for b in config.backends} == {ENV["VLLM_API_KEY"]}
    assert urlsplit(config.gateway.redis_url or "").password == ENV["REDIS_PASSWORD"]
    assert urlsplit(config.gateway.database_url or "").password == ENV["POSTGRES_PASSWORD"]
    for name in REQUIRED:
        with pytest.raises(ConfigError, match=f"environment variable {name} is not set"):
            load_config(path, env={k: v for k, v in ENV.items() if k != name})


def test_services_get_the_same_secret_variables(compose: dict[str, Any]) -> None:
    services = compose["services"]
    gateway_env = services["gateway"]["environment"]
    assert {name for name in gateway_env if name in REQUIRED} == REQUIRED, "config.toml expands them from here"
    for name in REQUIRED:
        assert references(gateway_env[name]).keys() == {name}
    for replica in (s for n, s in services.items() if n.startswith("vllm-")):
        (key,) = [arg for arg in replica["command"] if arg.startswith("--api-key=")]
        assert references(key).keys() == {"VLLM_API_KEY"}
    redis = services["redis"]["command"]
    assert references(redis[redis.index("--requirepass") + 1]).keys() == {"REDIS_PASSWORD"}
    postgres = services["postgres"]["environment"]["POSTGRES_PASSWORD"]
    assert references(postgres).keys() == {"POSTGRES_PASSWORD"}


def test_prometheus_sends_the_metrics_key_from_a_compose_secret(compose: dict[str, Any]) -> None:
    (secret,) = compose["services"]["prometheus"]["secrets"]
    assert compose["secrets"][secret] == {"environment": "ZEROGAP_METRICS_KEY"}
    prom = load_yaml(COMPOSE.parent / "prometheus.yml")
    (gateway,) = [job for job in prom["scrape_configs"] if job["job_name"] == "zerogap-gateway"]
    assert gateway["authorization"] == {"credentials_file": f"/run/secrets/{secret}"}
    others = [job for job in prom["scrape_configs"] if job["job_name"] != "zerogap-gateway"]
    assert not any("authorization" in job for job in others), "the key goes to the gateway only"


def test_stores_and_engines_publish_no_port(compose: dict[str, Any]) -> None:
    """Only containers of this project reach vLLM, Redis and PostgreSQL (the compose network)."""
    for name, service in compose["services"].items():
        if name.startswith("vllm-") or name in ("redis", "postgres"):
            assert "ports" not in service, name
