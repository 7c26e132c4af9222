"""deploy/compose: valid against the compose-spec JSON schema (shipped by check-jsonschema),
and wired the way the brief says: GPU-pinned vLLM replicas with our flags, mounts that exist."""

from __future__ import annotations

import json
import shutil
import subprocess
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from common.config.loader import load_config
from tests.deploy.flags import flag_map, launcher_flags
from tests.deploy.paths import COMPOSE, DEPLOY, PROMETHEUS, load_yaml
from tests.deploy.secrets import COMPOSE_ENV as ENV
from tests.tools import require_tool


def compose_schema() -> dict[str, Any]:
    """The compose-spec schema vendored by check-jsonschema (its source and licence are beside it)."""
    text = resources.files("check_jsonschema").joinpath("builtin_schemas/vendor/compose-spec.json").read_text()
    schema: dict[str, Any] = json.loads(text)
    return schema


def schema_errors(doc: Any) -> list[str]:
    schema = compose_schema()
    validator = jsonschema.validators.validator_for(schema)(schema)
    return [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(doc)]


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    doc: dict[str, Any] = load_yaml(COMPOSE)
    return doc


def test_compose_file_matches_the_compose_spec(compose: dict[str, Any]) -> None:
    assert schema_errors(compose) == []


def test_schema_check_can_fail(compose: dict[str, Any]) -> None:
    broken = json.loads(json.dumps(compose))
    broken["services"]["gateway"]["ports"] = "8000:8000"  # must be a list
    broken["services"]["vllm-0"]["restart_policy"] = "always"  # no such key
    assert len(schema_errors(broken)) >= 2


def test_services_for_one_gpu_host(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert {"gateway", "prometheus", "grafana", "dcgm-exporter"} <= set(services)
    replicas = sorted(name for name in services if name.startswith("vllm-"))
    assert len(replicas) >= 2
    gpus = []
    for name in replicas:
        service = services[name]
        assert service["image"].startswith("vllm/vllm-openai")
        flags = flag_map(service["command"])
        assert flags.pop("--api-key").startswith("${VLLM_API_KEY:?"), "the key is required (test_compose_secrets.py)"
        assert flags.pop("--otlp-traces-endpoint") == "http://otel-collector:4317", "vLLM's spans to the collector"
        assert flags == launcher_flags(), "the flags `zerogap backends up` passes"
        (device,) = service["deploy"]["resources"]["reservations"]["devices"]
        assert device["driver"] == "nvidia" and "gpu" in device["capabilities"]
        gpus.extend(device["device_ids"])
        assert "/health" in " ".join(service["healthcheck"]["test"])
    assert len(gpus) == len(set(gpus)), "each replica gets its own GPU"


def test_bind_mounts_exist(compose: dict[str, Any]) -> None:
    base = COMPOSE.parent
    for name, service in compose["services"].items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith((".", "/")) and "${" not in source:
                assert (base / source).exists(), f"{name}: {source} does not exist"


def test_gateway_config_in_compose_loads_and_matches_the_replicas(compose: dict[str, Any]) -> None:
    config = load_config(COMPOSE.parent / "config.toml", env=ENV)
    assert config.server.api_key == ENV["TAOTOKEN_API_KEY"]
    replicas = {name for name in compose["services"] if name.startswith("vllm-")}
    assert {b.name for b in config.backends} == replicas
    assert {b.url for b in config.backends} == {f"http://{name}:8000" for name in replicas}


def test_compose_prometheus_scrapes_every_service(compose: dict[str, Any], tmp_path: Path) -> None:
    prom = load_yaml(COMPOSE.parent / "prometheus.yml")
    targets = {t for job in prom["scrape_configs"] for sc in job.get("static_configs", []) for t in sc["targets"]}
    replicas = {name for name in compose["services"] if name.startswith("vllm-")}
    assert {f"{name}:8000" for name in replicas} | {"gateway:8000", "dcgm-exporter:9400"} <= targets
    promtool = require_tool("promtool")
    # As mounted in the container: prometheus.yml beside rules/, the metrics key in /run/secrets.
    text = (COMPOSE.parent / "prometheus.yml").read_text().replace("/run/secrets/", f"{tmp_path}/")
    (tmp_path / "prometheus.yml").write_text(text)
    (tmp_path / "zerogap_metrics_key").write_text(ENV["ZEROGAP_METRICS_KEY"])
    shutil.copytree(PROMETHEUS / "rules", tmp_path / "rules")
    done = subprocess.run(
        [promtool, "check", "config", str(tmp_path / "prometheus.yml")], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_dockerfile_copies_what_the_image_needs() -> None:
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    for part in ("zerogap", "gateway", "backends", "loadtest", "pyproject.toml"):
        assert f"COPY {part}" in dockerfile or f" {part} " in dockerfile
        assert (DEPLOY.parent / part).exists()


def test_flag_comparison_can_fail() -> None:
    assert flag_map(["--max-num-seqs=128", "--async-scheduling"]) != launcher_flags()
    assert flag_map(["--gpu-memory-utilization=0.90", "--x", "1"]) == {"--gpu-memory-utilization": "0.9", "--x": "1.0"}


def test_the_gateway_and_the_replicas_send_their_spans_to_the_collector(compose: dict[str, Any]) -> None:
    config = load_config(COMPOSE.parent / "config.toml", env=ENV)
    services = compose["services"]
    assert config.observability.otlp_endpoint == "http://otel-collector:4318"
    assert config.observability.otlp_protocol == "http/protobuf" and config.observability.sample_ratio == 0.1
    collector = services["otel-collector"]
    (mount,) = collector["volumes"]
    assert mount.split(":")[1] in " ".join(collector["command"])
    pipeline = load_yaml(COMPOSE.parent / mount.split(":")[0])
    assert pipeline["receivers"]["otlp"]["protocols"]["http"]["endpoint"].endswith(":4318")
    assert pipeline["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"].endswith(":4317")
    (exporter,) = pipeline["service"]["pipelines"]["traces"]["exporters"]
    assert pipeline["exporters"][exporter]["endpoint"].split(":")[0] in services  # the trace store, in compose


def test_gateway_workers_share_postgres_and_redis(compose: dict[str, Any]) -> None:
    config = load_config(COMPOSE.parent / "config.toml", env=ENV)
    assert config.gateway.database_url == f"postgresql://zerogap:{ENV['POSTGRES_PASSWORD']}@postgres:5432/zerogap"
    assert config.gateway.redis_url == f"redis://:{ENV['REDIS_PASSWORD']}@redis:6379/0"
    services = compose["services"]
    assert services["postgres"]["image"].startswith("postgres:") and services["redis"]["image"].startswith("redis:")
    assert services["postgres"]["environment"]["POSTGRES_USER"] == "zerogap"
    gateway = services["gateway"]
    assert gateway["depends_on"]["postgres"]["condition"] == "service_healthy"
    workers = gateway["command"][gateway["command"].index("--workers") + 1]
    assert workers == "${GATEWAY_WORKERS:-4}"
    assert gateway["environment"]["POSTGRES_PASSWORD"] == services["postgres"]["environment"]["POSTGRES_PASSWORD"]
