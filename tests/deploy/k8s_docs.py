"""deploy/k8s as data, for the k8s tests: the manifests, their workloads and Services, and which
pods the NetworkPolicies let connect to which pods on which ports."""

from __future__ import annotations

import functools
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import yaml

from common.config.loader import parse_config
from common.config.model import Config
from tests.deploy.paths import K8S
from tests.deploy.secrets import SECRETS

NAMESPACE = "zerogap"
SECRET = "zerogap-secrets"
_K8S_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")
Admitted = dict[int, set[str]]  # port -> names of the workloads whose pods may connect


def documents(files: list[Path] | None = None) -> list[dict[str, Any]]:
    """The manifests of the files (default: every one), parsed once; copy before changing one."""
    return list(_parsed(tuple(files or sorted(K8S.glob("*.yaml")))))


@functools.cache
def _parsed(files: tuple[Path, ...]) -> tuple[dict[str, Any], ...]:
    docs: list[dict[str, Any]] = []
    for path in files:
        if path.name != "kustomization.yaml":
            docs.extend(d for d in yaml.safe_load_all(path.read_text()) if d)
    return tuple(docs)


def find(kind: str, name: str) -> dict[str, Any]:
    matches = [d for d in documents() if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(matches) == 1, f"{kind}/{name}: {len(matches)} found"
    return matches[0]


def container(workload: dict[str, Any]) -> dict[str, Any]:
    (only,) = workload["spec"]["template"]["spec"]["containers"]
    result: dict[str, Any] = only
    return result


def gateway_config(env: dict[str, str] | None = None) -> Config:
    text = find("ConfigMap", "zerogap-config")["data"]["config.toml"]
    return parse_config(text, "k8s config.toml", env=SECRETS if env is None else env)


def secret_refs(c: dict[str, Any]) -> dict[str, str]:
    """env name -> key in zerogap-secrets, for every env var of a container read from that Secret."""
    refs = {}
    for e in c.get("env", []):
        ref = e.get("valueFrom", {}).get("secretKeyRef")
        if ref is not None:
            assert ref["name"] == SECRET, f"{e['name']}: from Secret {ref['name']}"
            refs[e["name"]] = ref["key"]
    return refs


def expand_args(c: dict[str, Any], env: dict[str, str]) -> list[str]:
    """The container's args as Kubernetes runs them: $(VAR) replaced by the container's env var VAR.
    A $(VAR) the container does not define would reach the program literally: an error here."""
    defined = {e["name"] for e in c.get("env", [])}

    def value(match: re.Match[str]) -> str:
        assert match.group(1) in defined, f"$({match.group(1)}) names no env var of container {c['name']}"
        return env[match.group(1)]

    return [_K8S_VAR.sub(value, arg) for arg in c.get("args", [])]


def workloads() -> dict[str, dict[str, str]]:
    """Deployment/StatefulSet name -> the labels of its pods."""
    return {
        d["metadata"]["name"]: d["spec"]["template"]["metadata"]["labels"]
        for d in documents()
        if d["kind"] in ("Deployment", "StatefulSet")
    }


def selected(selector: dict[str, Any]) -> set[str]:
    """The workloads whose pods a podSelector matches ({} matches every pod: the whole namespace)."""
    assert set(selector) <= {"matchLabels"}, f"only matchLabels selectors are understood here: {selector}"
    want = selector.get("matchLabels", {}).items()
    return {name for name, labels in workloads().items() if want <= labels.items()}


def policies(docs: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    return [d for d in (documents() if docs is None else docs) if d["kind"] == "NetworkPolicy"]


def admitted(workload: str, docs: list[dict[str, Any]] | None = None) -> Admitted | None:
    """Who may connect to the workload's pods, by port, under the policies that select them;
    None when no Ingress policy selects them (then anything may). Sources other than pods of this
    namespace (namespaceSelector, ipBlock) and rules without ports fail here: none is intended."""
    found: Admitted = defaultdict(set)
    guarded = False
    for policy in policies(docs):
        spec = policy["spec"]
        assert policy["metadata"]["namespace"] == NAMESPACE
        if workload not in selected(spec["podSelector"]) or "Ingress" not in spec.get("policyTypes", ["Ingress"]):
            continue
        guarded = True
        for rule in spec.get("ingress", []):
            assert rule.get("from") and rule.get("ports"), f"{policy['metadata']['name']}: a rule open to all"
            sources: set[str] = set()
            for peer in rule["from"]:
                assert set(peer) == {"podSelector"}, f"{policy['metadata']['name']}: a source outside the namespace"
                assert peer["podSelector"].get("matchLabels"), "an empty podSelector admits every pod"
                sources |= selected(peer["podSelector"])
            for port in rule["ports"]:
                assert port.get("protocol", "TCP") == "TCP" and isinstance(port["port"], int)
                found[port["port"]] |= sources
    return dict(found) if guarded else None


def service_target(host: str, port: int) -> tuple[str, int] | None:
    """(workload, container port) behind a cluster DNS name of this namespace and a Service port:
    svc.zerogap.svc or pod.svc.zerogap.svc; None for names in other namespaces."""
    suffix = f".{NAMESPACE}.svc"
    if not host.endswith(suffix):
        return None
    service = find("Service", host.removesuffix(suffix).split(".")[-1])
    (workload,) = selected({"matchLabels": service["spec"]["selector"]})
    (sp,) = [p for p in service["spec"]["ports"] if p["port"] == port]
    target = sp.get("targetPort", port)
    if isinstance(target, int):
        return workload, target
    pods = [d for d in documents() if d["kind"] in ("Deployment", "StatefulSet") and d["metadata"]["name"] == workload]
    (named,) = [p["containerPort"] for p in container(pods[0])["ports"] if p["name"] == target]
    return workload, named
