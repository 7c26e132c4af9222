"""deploy/k8s: every manifest valid against the Kubernetes JSON schemas (kubernetes-validate,
offline, strict: unknown fields are errors), and wired as the brief says."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
import yaml
from kubernetes_validate import utils as kv  # type: ignore[import-untyped]

from loadtest import parse_settings
from tests.deploy.flags import flag_map, launcher_flags
from tests.deploy.k8s_docs import container, documents, find, gateway_config, service_target
from tests.deploy.paths import K8S, load_yaml
from tests.deploy.secrets import SECRETS

K8S_VERSION = kv.latest_version()


@pytest.mark.parametrize("doc", documents(), ids=lambda d: f"{d['kind']}/{d['metadata']['name']}")
def test_manifest_is_valid(doc: dict[str, Any]) -> None:
    kv.validate(doc, K8S_VERSION, strict=True)


def test_validation_can_fail() -> None:
    deployment = copy.deepcopy(find("Deployment", "zerogap-gateway"))
    deployment["spec"]["replica"] = 2  # misspelt
    with pytest.raises(kv.ValidationError):
        kv.validate(deployment, K8S_VERSION, strict=True)
    container(deployment)["ports"][0]["containerPort"] = "8000"  # must be an integer
    del deployment["spec"]["replica"]
    with pytest.raises(kv.ValidationError):
        kv.validate(deployment, K8S_VERSION, strict=True)


def test_kustomization_lists_every_manifest() -> None:
    kustomization = load_yaml(K8S / "kustomization.yaml")
    files = sorted(p.name for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")
    assert sorted(kustomization["resources"]) == files


def test_gateway_has_service_probes_and_hpa() -> None:
    gateway = find("Deployment", "zerogap-gateway")
    c = container(gateway)
    assert c["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert c["livenessProbe"]["httpGet"]["path"] == "/health"
    assert c["command"][:2] == ["zerogap", "gateway"]
    service = find("Service", "zerogap-gateway")
    assert service["spec"]["selector"] == gateway["spec"]["selector"]["matchLabels"]
    assert service["spec"]["ports"][0]["port"] == 8000
    hpa = find("HorizontalPodAutoscaler", "zerogap-gateway")
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "zerogap-gateway"}
    assert hpa["spec"]["minReplicas"] >= 2


def test_vllm_requests_gpus_and_is_ready_on_health() -> None:
    vllm = find("StatefulSet", "vllm")
    c = container(vllm)
    assert c["resources"]["requests"]["nvidia.com/gpu"] == 1
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert c["readinessProbe"]["httpGet"]["path"] == "/health"
    flags = flag_map(c["args"])
    assert flags.pop("--api-key") == "$(VLLM_API_KEY)", "the key from the Secret (test_k8s_security.py)"
    assert flags.pop("--otlp-traces-endpoint") == "http://otel-collector.zerogap.svc:4317", "spans to the collector"
    assert flags == launcher_flags(), "the flags `zerogap backends up` passes"
    headless = find("Service", vllm["spec"]["serviceName"])
    assert headless["spec"]["clusterIP"] == "None"


def test_gateway_config_names_each_vllm_replica() -> None:
    config = gateway_config()
    replicas = find("StatefulSet", "vllm")["spec"]["replicas"]
    assert [b.url for b in config.backends] == [f"http://vllm-{i}.vllm.zerogap.svc:8000" for i in range(replicas)]


def test_rate_limits_are_shared_across_gateway_replicas() -> None:
    config = gateway_config()
    assert config.gateway.redis_url == f"redis://:{SECRETS['REDIS_PASSWORD']}@redis.zerogap.svc:6379/0"
    service = find("Service", "redis")
    assert service["spec"]["ports"][0]["port"] == 6379
    assert service["spec"]["selector"] == find("Deployment", "redis")["spec"]["selector"]["matchLabels"]


def test_locust_master_and_workers() -> None:
    master = container(find("Deployment", "locust-master"))
    worker = container(find("Deployment", "locust-worker"))
    assert master["command"][:4] == ["locust", "-f", "loadtest/", "--master"]
    assert worker["command"][:4] == ["locust", "-f", "loadtest/", "--worker"]
    assert worker["command"][worker["command"].index("--master-host") + 1] == "locust-master"
    service = find("Service", "locust-master")
    assert {p["port"] for p in service["spec"]["ports"]} == {8089, 5557, 9646}


def test_locust_settings_are_valid_for_the_harness() -> None:
    text = find("ConfigMap", "zerogap-loadtest")["data"]["settings.json"]
    settings = parse_settings(text, "k8s settings.json")
    assert settings.load_test.steps == [32, 128, 256]
    assert settings.api.base_url.startswith("http://zerogap-gateway.")
    assert settings.metrics.exporter_host == "0.0.0.0", "the master's /metrics must be reachable in the cluster"
    assert json.loads(text)["api"]["api_key_env"] == "TAOTOKEN_API_KEY"


def test_gateway_replicas_share_keys_in_postgres_and_serve_with_workers() -> None:
    config = gateway_config()
    password = SECRETS["POSTGRES_PASSWORD"]
    assert config.gateway.database_url == f"postgresql://zerogap:{password}@postgres.zerogap.svc:5432/zerogap"
    assert config.server.admin_key == SECRETS["ZEROGAP_ADMIN_KEY"]
    gateway = find("Deployment", "zerogap-gateway")
    c = container(gateway)
    assert int(c["command"][c["command"].index("--workers") + 1]) >= 2
    assert gateway["spec"]["replicas"] >= 2
    env = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in c["env"]}
    assert {k: v["key"] for k, v in env.items()} == {k: k for k in SECRETS}
    assert all(v["name"] == "zerogap-secrets" for v in env.values())
    assert not any(v.get("emptyDir") is not None for v in gateway["spec"]["template"]["spec"]["volumes"])
    service = find("Service", "postgres")
    database = find("StatefulSet", "postgres")
    assert service["spec"]["ports"][0]["port"] == 5432
    assert service["spec"]["selector"] == database["spec"]["selector"]["matchLabels"]
    db_env = {e["name"]: e for e in container(database)["env"]}
    assert db_env["POSTGRES_USER"]["value"] == "zerogap" and db_env["POSTGRES_DB"]["value"] == "zerogap"
    assert db_env["POSTGRES_PASSWORD"]["valueFrom"]["secretKeyRef"]["key"] == "POSTGRES_PASSWORD"


def test_the_collector_exports_to_the_stacks_trace_store() -> None:
    """The gateway's and vLLM's spans reach the collector, which sends them on to Jaeger in the stack
    (its OTLP/gRPC port, the one its pod listens on), not only to its own log."""
    assert gateway_config().observability.otlp_endpoint == "http://otel-collector.zerogap.svc:4318"
    pipeline = yaml.safe_load(find("ConfigMap", "otel-collector-config")["data"]["config.yaml"])
    traces = pipeline["service"]["pipelines"]["traces"]
    assert traces["receivers"] == ["otlp"] and "debug" not in traces["exporters"]
    (exporter,) = traces["exporters"]
    assert exporter.startswith("otlp") and pipeline["exporters"][exporter]["tls"] == {"insecure": True}
    host, port = pipeline["exporters"][exporter]["endpoint"].rsplit(":", 1)
    assert service_target(host, int(port)) == ("jaeger", 4317)
    jaeger = container(find("Deployment", "jaeger"))
    assert "receivers.otlp.protocols.grpc.endpoint=0.0.0.0:4317" in jaeger["args"], "OTLP on the pod's address"
    assert {p["name"]: p["containerPort"] for p in jaeger["ports"]} == {"otlp-grpc": 4317, "ui": 16686}
