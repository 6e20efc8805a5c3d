"""deploy/k8s (issue 13 §3): the Kubernetes manifests validate against Kubernetes' own schemas
(``kubernetes-validate``, offline, strict: unknown fields fail) and against the custom resources'
schemas vendored in ``tests/k8s_schemas`` (CloudNativePG Cluster and Pooler, ServiceMonitor; how
they were written is in its README), and say what the issue asks: migrations before the
Deployments, probes, replicas, disruption budgets, synchronous replication, a transaction-mode
Pooler for pooled queries and direct LISTEN/migrate connections, secrets from Secrets only.

The kustomization is rendered by a small renderer here (``kubectl`` is not a package this
machine's CI can install); when ``kubectl`` is present, its ``kubectl kustomize`` output must
name the same objects.
"""
from __future__ import annotations

import copy
import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from z9.cli import build_parser
from z9.common.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
SCHEMAS = Path(__file__).resolve().parents[1] / "k8s_schemas"
CRD_SCHEMAS = {
    ("postgresql.cnpg.io/v1", "Cluster"): "cnpg-cluster-v1.json",
    ("postgresql.cnpg.io/v1", "Pooler"): "cnpg-pooler-v1.json",
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "monitoring-servicemonitor-v1.json",
}
K8S_VERSION = "1.30.0"  # the oldest Kubernetes the manifests are meant for; every later one too


def render() -> list[dict[str, Any]]:
    """The objects ``kubectl apply -k deploy/k8s`` creates (the kustomize features used there:
    resources, namespace, labels without selectors, images, configMapGenerator literals)."""
    kz = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    docs: list[dict[str, Any]] = []
    for res in kz["resources"]:
        docs += [d for d in yaml.safe_load_all((K8S / res).read_text()) if d]
    for gen in kz.get("configMapGenerator", []):
        data = dict(lit.split("=", 1) for lit in gen.get("literals", []))
        docs.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": gen["name"]}, "data": data})
    images = {i["name"]: f"{i['newName']}:{i['newTag']}" for i in kz.get("images", [])}
    labels = {k: v for group in kz.get("labels", []) for k, v in group["pairs"].items()}
    out = []
    for d in docs:
        d = copy.deepcopy(d)
        if d["kind"] != "Namespace" and kz.get("namespace"):
            d["metadata"]["namespace"] = kz["namespace"]
        d["metadata"].setdefault("labels", {}).update(labels)
        for c in _containers(d):
            c["image"] = images.get(c["image"], c["image"])
        out.append(d)
    return out


def _pod_spec(d: dict[str, Any]) -> dict[str, Any] | None:
    if d["kind"] in ("Deployment", "Job"):
        return d["spec"]["template"]["spec"]
    return None


def _containers(d: dict[str, Any]) -> list[dict[str, Any]]:
    spec = _pod_spec(d)
    return [] if spec is None else spec.get("initContainers", []) + spec["containers"]


def _by(kind: str, docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


@pytest.fixture(scope="module")
def docs() -> list[dict[str, Any]]:
    return render()


def test_every_object_validates_against_its_schema(docs: list[dict[str, Any]]) -> None:
    kinds = set()
    for d in docs:
        key = (d["apiVersion"], d["kind"])
        kinds.add(d["kind"])
        if key in CRD_SCHEMAS:
            schema = json.loads((SCHEMAS / CRD_SCHEMAS[key]).read_text())
            jsonschema.validate(d, schema, cls=jsonschema.Draft202012Validator)
        else:
            kubernetes_validate.validate(d, K8S_VERSION, strict=True)
    assert {"Namespace", "ConfigMap", "Job", "Deployment", "Service", "PodDisruptionBudget", "Cluster", "Pooler",
            "ServiceMonitor"} <= kinds


def test_the_validators_reject_what_they_should(docs: list[dict[str, Any]]) -> None:
    """The schemas are not vacuous: a misspelt field, a wrong enum value are refused."""
    dep = copy.deepcopy(_by("Deployment", docs)["z9-api"])
    dep["spec"]["template"]["spec"]["containers"][0]["readinessprobe"] = dep["spec"]["template"]["spec"][
        "containers"][0].pop("readinessProbe")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(dep, K8S_VERSION, strict=True)
    pooler = copy.deepcopy(_by("Pooler", docs)["z9-db-pooler-rw"])
    pooler["spec"]["pgbouncer"]["poolMode"] = "statement"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(pooler, json.loads((SCHEMAS / "cnpg-pooler-v1.json").read_text()))
    cluster = copy.deepcopy(_by("Cluster", docs)["z9-db"])
    cluster["spec"]["postgresql"]["synchronous"]["dataDurability"] = "maybe"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(cluster, json.loads((SCHEMAS / "cnpg-cluster-v1.json").read_text()))


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_kubectl_kustomize_renders_the_same_objects(docs: list[dict[str, Any]]) -> None:
    out = subprocess.run(["kubectl", "kustomize", str(K8S)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    theirs = [d for d in yaml.safe_load_all(out.stdout) if d]
    key = lambda d: (d["kind"], d["metadata"]["name"], d["metadata"].get("namespace"))  # noqa: E731
    assert sorted(map(key, theirs)) == sorted(map(key, docs))
    for d in theirs:  # and kubectl's rendering validates too
        if (d["apiVersion"], d["kind"]) not in CRD_SCHEMAS:
            kubernetes_validate.validate(d, K8S_VERSION, strict=True)
        for c in _containers(d):
            assert c["image"] == "registry.example.com/z9:0.1.0"


def test_migrations_run_before_the_new_version_s_pods(docs: list[dict[str, Any]]) -> None:
    (job,) = _by("Job", docs).values()
    assert job["spec"]["template"]["spec"]["containers"][0]["args"] == ["migrate"]
    for name, dep in _by("Deployment", docs).items():
        inits = dep["spec"]["template"]["spec"].get("initContainers", [])
        assert [c["args"][:2] for c in inits] == [["migrate", "--wait"]], name


def test_every_z9_container_runs_a_real_command(docs: list[dict[str, Any]]) -> None:
    parser = build_parser()
    for d in docs:
        for c in _containers(d):
            parser.parse_args(c["args"])  # SystemExit on an unknown command or option


def test_replicas_probes_and_disruption_budgets(docs: list[dict[str, Any]]) -> None:
    deps = _by("Deployment", docs)
    executors = {n: d for n, d in deps.items() if d["spec"]["template"]["spec"]["containers"][0]["args"][0] == "executor"}
    assert executors, "no executor Deployment"
    for name, d in executors.items():
        args = d["spec"]["template"]["spec"]["containers"][0]["args"]
        assert "--region" in args and d["spec"]["replicas"] >= 2, name
    for comp in ("scheduler", "reaper"):
        assert deps[f"z9-{comp}"]["spec"]["replicas"] == 2
    api = deps["z9-api"]["spec"]["template"]["spec"]["containers"][0]
    assert api["readinessProbe"]["httpGet"]["path"] == "/healthz" and api["livenessProbe"]
    for name, d in deps.items():
        c = d["spec"]["template"]["spec"]["containers"][0]
        assert c.get("livenessProbe") and c.get("readinessProbe"), name
    pdbs = _by("PodDisruptionBudget", docs)
    for name, d in deps.items():
        labels = d["spec"]["template"]["metadata"]["labels"]
        assert any(set(p["spec"]["selector"]["matchLabels"].items()) <= set(labels.items()) for p in pdbs.values()), name
    # The API Service reaches the API pods on a port they serve.
    svc = _by("Service", docs)["z9-api"]
    assert set(svc["spec"]["selector"].items()) <= set(deps["z9-api"]["spec"]["template"]["metadata"]["labels"].items())
    assert svc["spec"]["ports"][0]["targetPort"] in {p["name"] for p in api["ports"]}


def test_service_monitor_reaches_every_service_s_metrics(docs: list[dict[str, Any]]) -> None:
    (sm,) = _by("ServiceMonitor", docs).values()
    ports = {e["port"] for e in sm["spec"]["endpoints"]}
    services = [s for s in _by("Service", docs).values()
                if set(sm["spec"]["selector"]["matchLabels"].items()) <= set(s["metadata"]["labels"].items())]
    served = set()
    for s in services:
        for dep in _by("Deployment", docs).values():
            labels = dep["spec"]["template"]["metadata"]["labels"]
            if set(s["spec"]["selector"].items()) <= set(labels.items()):
                names = {p["name"] for p in s["spec"]["ports"]} & ports
                pod_ports = {p["name"] for p in dep["spec"]["template"]["spec"]["containers"][0]["ports"]}
                assert any(p["targetPort"] in pod_ports for p in s["spec"]["ports"] if p["name"] in names)
                served.add(dep["metadata"]["name"])
    assert served == set(_by("Deployment", docs)), served


def test_database_is_synchronous_and_pooled_in_transaction_mode(docs: list[dict[str, Any]]) -> None:
    cluster = _by("Cluster", docs)["z9-db"]["spec"]
    assert cluster["instances"] >= 2
    sync = cluster["postgresql"]["synchronous"]
    assert sync["number"] >= 1 and sync.get("dataDurability", "required") == "required"
    assert cluster["postgresql"]["parameters"]["plan_cache_mode"] == "force_custom_plan"
    pooler = _by("Pooler", docs)["z9-db-pooler-rw"]["spec"]
    assert pooler["cluster"]["name"] == "z9-db" and pooler["type"] == "rw"
    assert pooler["pgbouncer"]["poolMode"] == "transaction"
    settings = _by("ConfigMap", docs)["z9-settings"]["data"]
    assert settings["Z9_DATABASE_POOLER"] == "transaction"
    assert settings["Z9_DATABASE_REQUIRE_SYNC_REPLICATION"] == "true"
    for d in docs:
        for c in _containers(d):
            env = {e["name"]: e for e in c.get("env", [])}
            # LISTEN and migrations direct to the primary's Service, pooled queries through the Pooler.
            assert "@z9-db-rw:" in env["Z9_DATABASE_DIRECT_URL"]["value"], c["name"]
            if "Z9_DATABASE_URL" in env:
                assert "@z9-db-pooler-rw:" in env["Z9_DATABASE_URL"]["value"]


def test_secrets_come_from_secrets_only_and_every_setting_exists(docs: list[dict[str, Any]]) -> None:
    assert not [d for d in docs if d["kind"] == "Secret"], "no Secret belongs in the repository"
    known = {f"Z9_{n.upper()}" for n in Settings.model_fields}
    for d in docs:
        names = list(d.get("data", {})) if d["kind"] == "ConfigMap" else []
        for c in _containers(d):
            for e in c.get("env", []):
                names.append(e["name"])
                value = e.get("value", "")
                if re.search(r"(?i)secret|password|token", e["name"]) or "REGIONS" in e["name"]:
                    assert "valueFrom" in e and "secretKeyRef" in e["valueFrom"], (c["name"], e["name"])
                # Credentials in a URL only as $(VAR) references to secret-backed variables.
                m = re.search(r"://([^@/]*)@", value)
                if m:
                    assert re.fullmatch(r"\$\(\w+\):\$\(\w+\)", m.group(1)), (c["name"], e["name"])
        unknown = [n for n in names if n.startswith("Z9_") and n not in known]
        assert not unknown, f"{d['metadata']['name']}: not z9 settings: {unknown}"
        text = yaml.safe_dump(d)
        assert not re.search(r"(?i)(password|secret)\s*[:=]\s*['\"]?[A-Za-z0-9+/]{12,}", text), d["metadata"]["name"]


def test_readme_walks_from_an_empty_cluster_to_a_running_z9() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Production on Kubernetes", 1)[1].split("\n## ", 1)[0]
    for step in ("cnpg-controller-manager", "create secret generic z9-regions", "kubectl apply -k deploy/k8s",
                 "kubectl -n z9 wait", "z9 token", "delete job z9-migrate"):
        assert step in section, step
    # Every kubectl command in it names objects that exist in the manifests.
    names = {d["metadata"]["name"] for d in render()}
    for line in section.splitlines():
        for ref in re.findall(r"(?:deployment|job|svc|service|cluster|pooler)/([a-z0-9-]+)", line):
            assert ref in names, (ref, line)
