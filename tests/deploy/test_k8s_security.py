"""deploy/k8s, the secrets and the network: every secret from the Secret zerogap-secrets (and the
README's command makes each one), vLLM started with the key the gateway sends upstream, Redis
with the password its redis_url carries (tried on a real redis-server), Prometheus sending the
metrics key, and NetworkPolicies that let only gateway pods reach vLLM, Redis and PostgreSQL
while every connection the stack makes still passes."""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from loadtest import parse_settings
from tests.deploy.k8s_docs import (
    NAMESPACE,
    SECRET,
    Admitted,
    admitted,
    container,
    documents,
    expand_args,
    find,
    gateway_config,
    policies,
    secret_refs,
    selected,
    service_target,
    workloads,
)
from tests.deploy.paths import DEPLOY, K8S, PROMETHEUS
from tests.deploy.secrets import SECRETS
from tests.tools import require_tool

# Who may open a connection to whom: workload -> {port: source workloads}; None: no policy (open).
EXPECTED: dict[str, Admitted | None] = {
    "vllm": {8000: {"zerogap-gateway", "prometheus", "locust-master", "locust-worker"}},
    "redis": {6379: {"zerogap-gateway"}},
    "postgres": {5432: {"zerogap-gateway"}},
    "prometheus": {9090: {"locust-master"}},
    "locust-master": {5557: {"locust-worker"}, 9646: {"prometheus"}},
    "otel-collector": {4317: {"zerogap-gateway", "vllm"}, 4318: {"zerogap-gateway", "vllm"}},
    "jaeger": {4317: {"otel-collector"}},  # its UI: kubectl port-forward
    "zerogap-gateway": None,  # the way in
    "locust-worker": None,  # listens on nothing
}
METRICS_KEY_FILE = "/etc/prometheus/secrets/metrics-key"
SECRET_VAR = re.compile(r"^\$\{[A-Z_]+\}$")


def prometheus_config() -> dict[str, Any]:
    config: dict[str, Any] = yaml.safe_load(find("ConfigMap", "zerogap-prometheus")["data"]["prometheus.yml"])
    return config


def every_container() -> list[dict[str, Any]]:
    return [container(d) for d in documents() if d["kind"] in ("Deployment", "StatefulSet")]


def test_every_secret_comes_from_the_one_secret_and_the_readme_creates_each() -> None:
    used = set().union(*(secret_refs(c).values() for c in every_container()))
    for d in documents():
        for volume in d.get("spec", {}).get("template", {}).get("spec", {}).get("volumes", []):
            if "secret" in volume:
                assert volume["secret"]["secretName"] == SECRET
                used |= {item["key"] for item in volume["secret"]["items"]}
    assert used == set(SECRETS)
    readme = (DEPLOY / "README.md").read_text()
    command = readme[readme.index(f"create secret generic {SECRET}") :].split("\n\n", 1)[0]
    assert set(re.findall(r"--from-literal=([A-Z_]+)=", command)) == set(SECRETS), command


def test_config_reads_every_secret_from_the_environment() -> None:
    """No secret is written in the ConfigMap: each is ${VAR}, set from the Secret."""
    text = find("ConfigMap", "zerogap-config")["data"]["config.toml"]
    raw = tomllib.loads(text)
    for field in ("api_key", "admin_key", "metrics_key"):
        assert SECRET_VAR.match(raw["server"][field]), f"[server].{field} = {raw['server'][field]!r}"
    assert all(SECRET_VAR.match(b["api_key"]) for b in raw["backends"])
    config = gateway_config()
    assert config.server.metrics_key == SECRETS["ZEROGAP_METRICS_KEY"]
    assert urlsplit(config.gateway.database_url or "").password == SECRETS["POSTGRES_PASSWORD"]
    assert secret_refs(container(find("StatefulSet", "postgres"))) == {"POSTGRES_PASSWORD": "POSTGRES_PASSWORD"}
    gateway_env = secret_refs(container(find("Deployment", "zerogap-gateway")))
    assert gateway_env == {k: k for k in SECRETS}, "the gateway expands every ${VAR} from its own env"


def test_vllm_requires_the_key_the_gateway_sends_upstream() -> None:
    vllm = container(find("StatefulSet", "vllm"))
    assert secret_refs(vllm) == {"VLLM_API_KEY": "VLLM_API_KEY"}
    args = expand_args(vllm, SECRETS)
    assert f"--api-key={SECRETS['VLLM_API_KEY']}" in args
    keys = {b.name: b.api_key for b in gateway_config().backends}
    assert keys == {
        f"vllm-{i}": SECRETS["VLLM_API_KEY"] for i in range(find("StatefulSet", "vllm")["spec"]["replicas"])
    }


def test_args_naming_an_undefined_variable_are_caught() -> None:
    vllm = copy.deepcopy(container(find("StatefulSet", "vllm")))
    vllm["env"] = []
    with pytest.raises(AssertionError, match=r"\$\(VLLM_API_KEY\) names no env var"):
        expand_args(vllm, SECRETS)


def test_redis_requires_the_password_of_redis_url() -> None:
    """Tried on a real redis-server, with PostgreSQL's password too, in test_store_passwords.py."""
    args = expand_args(container(find("Deployment", "redis")), SECRETS)
    assert args[args.index("--requirepass") + 1] == SECRETS["REDIS_PASSWORD"]
    assert secret_refs(container(find("Deployment", "redis"))) == {"REDIS_PASSWORD": "REDIS_PASSWORD"}
    assert urlsplit(gateway_config().gateway.redis_url or "").password == SECRETS["REDIS_PASSWORD"]


def test_prometheus_sends_the_metrics_key_from_the_secret() -> None:
    jobs = {job["job_name"]: job for job in prometheus_config()["scrape_configs"]}
    local = {job["job_name"] for job in yaml.safe_load((PROMETHEUS / "prometheus.yml").read_text())["scrape_configs"]}
    assert set(jobs) == local, "the dashboards read these job names"
    assert jobs["zerogap-gateway"]["authorization"] == {"credentials_file": METRICS_KEY_FILE}
    deployment = find("Deployment", "prometheus")
    mounts = {m["mountPath"]: m["name"] for m in container(deployment)["volumeMounts"]}
    folder, file = METRICS_KEY_FILE.rsplit("/", 1)
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    secret = volumes[mounts[folder]]["secret"]
    assert secret["secretName"] == SECRET and secret["items"] == [{"key": "ZEROGAP_METRICS_KEY", "path": file}]
    assert secret["defaultMode"] & 0o040 and deployment["spec"]["template"]["spec"]["securityContext"]["fsGroup"]
    config_mount = next(
        p for p, name in mounts.items() if volumes[name].get("configMap", {}).get("name") == "zerogap-prometheus"
    )
    assert f"--config.file={config_mount}/prometheus.yml" in container(deployment)["args"]
    backends = jobs["zerogap-backends"]["static_configs"]
    assert {g["labels"]["backend"] for g in backends} == {b.name for b in gateway_config().backends}


def test_prometheus_config_of_the_manifest_passes_promtool(tmp_path: Path) -> None:
    """promtool checks the ConfigMap's prometheus.yml as mounted: key file and rules beside it."""
    text = find("ConfigMap", "zerogap-prometheus")["data"]["prometheus.yml"]
    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets" / "metrics-key").write_text(SECRETS["ZEROGAP_METRICS_KEY"])
    shutil.copytree(PROMETHEUS / "rules", tmp_path / "rules")
    (tmp_path / "rules" / "zerogap.rules.test.yml").unlink()  # not a rule file
    (tmp_path / "prometheus.yml").write_text(text.replace("/etc/prometheus/", f"{tmp_path}/"))
    done = subprocess.run(
        [require_tool("promtool"), "check", "config", str(tmp_path / "prometheus.yml")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 1 rule files found" in done.stdout


def test_network_policies_admit_only_whom_they_should() -> None:
    assert {name: admitted(name) for name in workloads()} == EXPECTED
    core = [d for d in documents() if d not in documents([K8S / "locust.yaml"])]
    assert admitted("vllm", core) == {8000: {"zerogap-gateway", "prometheus"}}, "without the load generator"


def test_every_policy_selector_matches_pods() -> None:
    """A label misspelt in a policy would select nothing and guard nothing (or admit no one)."""
    for policy in policies():
        spec = policy["spec"]
        assert selected(spec["podSelector"]), policy["metadata"]["name"]
        for rule in spec["ingress"]:
            for peer in rule["from"]:
                assert selected(peer["podSelector"]), (policy["metadata"]["name"], peer)


def connections() -> list[tuple[str, str]]:
    """(source workload, URL or host:port) for every connection the configs and commands make."""
    config = gateway_config()
    out = [("zerogap-gateway", b.url) for b in config.backends]
    out += [("zerogap-gateway", config.gateway.redis_url or ""), ("zerogap-gateway", config.gateway.database_url or "")]
    out += [("zerogap-gateway", config.observability.otlp_endpoint)]
    vllm_args = container(find("StatefulSet", "vllm"))["args"]
    out += [("vllm", a.split("=", 1)[1]) for a in vllm_args if a.startswith("--otlp-traces-endpoint=")]
    out += [("otel-collector", f"http://{endpoint}") for endpoint in collector_exports()]
    for job in prometheus_config()["scrape_configs"]:
        for group in job.get("static_configs", []):
            out += [("prometheus", f"http://{t}") for t in group["targets"]]
        for sd in job.get("dns_sd_configs", []):
            out += [("prometheus", f"http://{name}:{sd['port']}") for name in sd["names"]]
    settings = parse_settings(find("ConfigMap", "zerogap-loadtest")["data"]["settings.json"], "settings.json")
    for role in ("locust-master", "locust-worker"):
        out += [(role, settings.api.base_url), (role, settings.workload.tokenize_url)]
    out += [("locust-master", url) for url in settings.metrics.backend_metrics_urls or []]
    out += [("locust-master", settings.metrics.gpu_util.prometheus_url)]
    out += [("locust-worker", f"tcp://locust-master.{NAMESPACE}.svc:5557")]
    return out


def collector_exports() -> list[str]:
    """host:port of each exporter in the collector's traces pipeline."""
    pipeline = yaml.safe_load(find("ConfigMap", "otel-collector-config")["data"]["config.yaml"])
    return [pipeline["exporters"][name]["endpoint"] for name in pipeline["service"]["pipelines"]["traces"]["exporters"]]


def blocked(docs: list[dict[str, Any]] | None = None) -> list[str]:
    problems = []
    for source, url in connections():
        parts = urlsplit(url)
        target = service_target(parts.hostname or "", parts.port or 80)
        if target is None:
            continue
        allowed = admitted(target[0], docs)
        if allowed is not None and source not in allowed.get(target[1], set()):
            problems.append(f"{source} -> {url}")
    return problems


def test_every_connection_the_stack_makes_is_allowed() -> None:
    assert len(connections()) >= 14
    assert blocked() == []


def test_policy_checks_can_fail() -> None:
    docs = copy.deepcopy(documents())
    (vllm,) = [d for d in docs if d["kind"] == "NetworkPolicy" and d["metadata"]["name"] == "vllm-ingress"]
    vllm["spec"]["ingress"][0]["from"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/name"] = "gateway"
    assert "zerogap-gateway -> http://vllm-0.vllm.zerogap.svc:8000" in blocked(docs)
    (jaeger,) = [d for d in docs if d["kind"] == "NetworkPolicy" and d["metadata"]["name"] == "jaeger-ingress"]
    jaeger["spec"]["ingress"][0]["from"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/name"] = "vllm"
    assert "otel-collector -> http://jaeger.zerogap.svc:4317" in blocked(docs)
    docs = [d for d in docs if d["metadata"]["name"] != "redis-ingress"]
    assert admitted("redis", docs) is None, "no policy: anyone may connect"
    vllm["spec"]["ingress"][0]["from"].append({"namespaceSelector": {}})
    with pytest.raises(AssertionError, match="outside the namespace"):
        admitted("vllm", docs)


def test_no_pod_invites_a_cluster_prometheus() -> None:
    """prometheus.io/* annotations would point a cluster-wide Prometheus at ports the policies close."""
    for d in documents():
        annotations = d.get("spec", {}).get("template", {}).get("metadata", {}).get("annotations", {})
        assert not any(k.startswith("prometheus.io/") for k in annotations), d["metadata"]["name"]
