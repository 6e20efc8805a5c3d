"""Every kind from the client, as a new user drives it (no curl): load balancers and clusters
through ``z9 load-balancers …`` / ``z9 clusters …`` (create → wait → get → an action →
kubeconfig ``--merge`` → delete) against the real stack, with ``-o json`` printing the API's own
shapes; ``z9 jobs list`` newest first with its "more" hint and filters; name lookups that skip
deleted resources; ``z9 quota show`` (``GET /v1/quota``); the typed Python client's methods."""
from __future__ import annotations

import asyncio
import json
import os
import stat
from pathlib import Path
from typing import Any

import yaml

from z9.client import Client

from tests.support import REGION, SimAdmin, Stack, wait_until
from tests.integration.client.test_client import CREATE, client_env, z9
from tests.integration.clusters.test_clusters_e2e import K8S_TIMING
from tests.integration.load_balancers.test_load_balancers import LB_TEMPLATE


async def _ok(*args: str, env: dict[str, str]) -> Any:
    code, out, err = await z9(*args, "-o", "json", env=env, timeout_s=240)
    assert code == 0, (args, out, err)
    return json.loads(out)


async def test_load_balancer_walkthrough_from_the_client(stack: Stack, sim: SimAdmin, tmp_path: Path) -> None:
    await sim._req("POST", "/vms", json=LB_TEMPLATE)
    env = client_env(stack, tmp_path)
    srv = (await _ok(*CREATE, "--name", "web-a", "--public-ipv4", "--wait", env=env))["server"]

    async def addressed() -> Any:
        return (await stack.server(srv["id"]))["public_ipv4"]
    await wait_until(addressed, 30, "the server's address")

    out = await _ok("load-balancers", "create", "--name", "front", "--region", REGION, "--service", "tcp:80:8080",
                    "--health-interval", "3", "--health-timeout", "2", "--target", srv["id"], "--wait", env=env)
    assert set(out) == {"load_balancer", "job"}, out  # the API's own shape
    lb = out["load_balancer"]
    assert lb["status"] == "active" and out["job"]["status"] == "succeeded", out
    assert lb["services"][0]["health_check"]["interval_s"] == 3
    assert [t["server_id"] for t in lb["targets"]] == [srv["id"]]

    got = await _ok("load-balancers", "get", lb["id"], env=env)
    assert got["load_balancer"]["id"] == lb["id"]
    code, table, err = await z9("load-balancers", "list", env=env)
    assert code == 0 and lb["id"] in table and "front" in table and "tcp:80:8080" in table, (table, err)

    # actions: a target by IP, a second service, the algorithm; each a LoadBalancerConfigure
    out = await _ok("load-balancers", "add-target", lb["id"], "--ip", "198.51.100.7", "--wait", env=env)
    assert out["job"]["kind"] == "LoadBalancerConfigure" and out["job"]["status"] == "succeeded"
    assert {t.get("ip") for t in out["load_balancer"]["targets"]} >= {"198.51.100.7"}
    out = await _ok("load-balancers", "add-service", lb["id"], "--listen-port", "443", "--destination-port", "8443",
                    "--wait", env=env)
    assert [s["listen_port"] for s in out["load_balancer"]["services"]] == [80, 443]
    out = await _ok("load-balancers", "update-service", lb["id"], "--listen-port", "443", "--destination-port",
                    "9443", "--health-retries", "5", "--wait", env=env)
    s443 = out["load_balancer"]["services"][1]
    assert (s443["destination_port"], s443["health_check"]["retries"]) == (9443, 5)
    out = await _ok("load-balancers", "delete-service", lb["id"], "--listen-port", "443", "--wait", env=env)
    assert [s["listen_port"] for s in out["load_balancer"]["services"]] == [80]
    out = await _ok("load-balancers", "change-algorithm", lb["id"], "--algorithm", "least_connections", "--wait",
                    env=env)
    assert out["load_balancer"]["algorithm"] == "least_connections"
    out = await _ok("load-balancers", "remove-target", lb["id"], "--ip", "198.51.100.7", "--wait", env=env)
    assert [t["server_id"] for t in out["load_balancer"]["targets"]] == [srv["id"]]
    out = await _ok("load-balancers", "update", lb["id"], "--name", "front-2", "--label", "env=prod", env=env)
    assert (out["load_balancer"]["name"], out["load_balancer"]["labels"]) == ("front-2", {"env": "prod"})

    # a refusal under -o json: the API's error on stderr, exit 3
    code, out, err = await z9("load-balancers", "add-target", lb["id"], "--server", srv["id"], "-o", "json", env=env)
    assert code == 3 and out == "", (out, err)
    refusal = json.loads(err)
    assert refusal["status"] == 409 and refusal["error"]["code"] == "target_already_defined", refusal
    code, out, err = await z9("load-balancers", "add-target", lb["id"], env=env)  # neither --server nor --ip
    assert code == 64 and "--server" in err, err

    # delete (buffered) and restore, then delete for good
    out = await _ok("load-balancers", "delete", lb["id"], "--wait", env=env)
    assert out["load_balancer"]["status"] == "deleting" and out["load_balancer"]["delete_after"], out
    out = await _ok("load-balancers", "restore", lb["id"], "--wait", env=env)
    assert out["load_balancer"]["status"] == "active", out
    out = await _ok("load-balancers", "delete", lb["id"], env=env)
    assert out["job"]["status"] == "pending" and out["load_balancer"]["status"] == "deleting"

    # the typed Python client reads the same
    c = Client(stack.base, stack.token)
    got = await asyncio.to_thread(c.get_load_balancer, lb["id"])
    assert got.name == "front-2" and got.vip and got.vip.startswith("203.0.113.")
    page = await asyncio.to_thread(c.list_load_balancers, label_selector="env=prod")
    assert [x.id for x in page.items] == [lb["id"]]


async def test_cluster_walkthrough_from_the_client(stack: Stack, sim: SimAdmin, tmp_path: Path) -> None:
    await sim.configure(**K8S_TIMING)
    kube = tmp_path / "kube" / "config"
    kube.parent.mkdir()
    kube.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "Config", "current-context": "other",
                                    "clusters": [{"name": "other", "cluster": {"server": "https://192.0.2.1"}}],
                                    "users": [{"name": "other", "user": {"token": "x"}}],
                                    "contexts": [{"name": "other", "context": {"cluster": "other", "user": "other"}}]}))
    env = client_env(stack, tmp_path, KUBECONFIG=f"{kube}{os.pathsep}{tmp_path / 'second'}")
    out = await _ok("clusters", "create", "--name", "demo", "--region", REGION, "--version", "1.33",
                    "--node-pool", "workers:1:2:2048:20", "--wait", env=env)
    assert set(out) == {"cluster", "job"}, out
    k8s = out["cluster"]
    assert k8s["status"] == "running" and out["job"]["kind"] == "ClusterCreate", out
    assert (await _ok("clusters", "get", k8s["id"], env=env))["cluster"]["kubeconfig_available"] is True

    out = await _ok("clusters", "resize-node-pool", k8s["id"], "--pool", "workers", "--count", "2", "--wait", env=env)
    assert out["job"]["kind"] == "ClusterReconcile" and out["job"]["status"] == "succeeded"
    assert [p["count"] for p in out["cluster"]["node_pools"]] == [2]

    # kubeconfig --merge: into the first file of $KUBECONFIG, 0600, a context named after the cluster
    info = await _ok("clusters", "kubeconfig", k8s["id"], "--merge", "--expiry", "2h", env=env)
    assert info["path"] == str(kube) and info["context"] == "z9-demo", info
    assert stat.S_IMODE(kube.stat().st_mode) == 0o600
    doc = yaml.safe_load(kube.read_text())
    assert doc["current-context"] == "z9-demo"
    assert sorted(c["name"] for c in doc["contexts"]) == ["other", "z9-demo"]  # the other one kept
    assert next(c for c in doc["clusters"] if c["name"] == "z9-demo")["cluster"]["server"] == \
        out["cluster"]["endpoint"]["url"]
    await _ok("clusters", "kubeconfig", k8s["id"], "--merge", env=env)  # again: replaced, not doubled
    doc = yaml.safe_load(kube.read_text())
    assert sorted(c["name"] for c in doc["users"]) == ["other", "z9-demo"]
    # --file: written 0600; without either: the YAML on stdout
    dest = tmp_path / "demo.yaml"
    await _ok("clusters", "kubeconfig", k8s["id"], "--file", str(dest), env=env)
    assert stat.S_IMODE(dest.stat().st_mode) == 0o600 and "client-key-data" in dest.read_text()
    code, text, err = await z9("clusters", "kubeconfig", k8s["id"], env=env)
    assert code == 0 and yaml.safe_load(text)["kind"] == "Config", err

    # a token of the read and write scopes (what `z9 token` hands out) gets one too
    rw = (await _ok("tokens", "create", "--name", "rw", "--scope", "read", "--scope", "write", env=env))["secret"]
    code, _, err = await z9("clusters", "kubeconfig", k8s["id"], "--file", str(tmp_path / "rw.yaml"),
                            env={**env, "Z9_TOKEN": rw})
    assert code == 0, err

    out = await _ok("clusters", "update", k8s["id"], "--label", "env=dev", env=env)
    assert out["cluster"]["labels"] == {"env": "dev"}
    out = await _ok("clusters", "delete", k8s["id"], "--wait", env=env)
    assert out["cluster"]["status"] == "deleted" and out["job"]["kind"] == "ClusterDelete", out
    code, _, err = await z9("clusters", "restore", k8s["id"], env=env)
    assert code == 64  # no buffer: no restore command


async def test_jobs_list_newest_first_with_filters_and_a_more_hint(stack: Stack, tmp_path: Path) -> None:
    env = client_env(stack, tmp_path)
    sid = (await _ok(*CREATE, "--name", "jl-1", "--wait", env=env))["server"]["id"]
    await _ok("servers", "shutdown", sid, "--wait", env=env)
    await _ok("servers", "start", sid, "--wait", env=env)
    await _ok("servers", "stop", sid, "--wait", env=env)  # the old verb: an alias of shutdown
    # an observe-only job (as the periodic observers make): hidden unless asked for
    await stack.pool.execute(
        "INSERT INTO jobs (id, tenant_id, kind, region, status, args, finished_at, max_attempts) "
        "SELECT 'job_01jd3x5v8q2m6n4p7r9s1t3zzz', tenant_id, 'ClusterObserve', region, 'succeeded', '{}', now(), 1 "
        "FROM servers WHERE id = $1", sid)
    jobs = (await _ok("jobs", "list", env=env))["jobs"]
    kinds = [j["kind"] for j in jobs]
    assert kinds == ["ServerStop", "ServerStart", "ServerStop", "ServerCreate"], kinds  # newest first, no observe
    assert [j["kind"] for j in (await _ok("jobs", "list", "--include-observe", env=env))["jobs"]][0] == "ClusterObserve"
    assert [j["kind"] for j in (await _ok("jobs", "list", "--oldest", env=env))["jobs"]] == kinds[::-1]
    assert [j["kind"] for j in (await _ok("jobs", "list", "--kind", "ServerCreate", env=env))["jobs"]] == \
        ["ServerCreate"]
    statuses = {j["status"] for j in (await _ok("jobs", "list", "--status", "succeeded", env=env))["jobs"]}
    assert statuses == {"succeeded"}
    code, out, err = await z9("jobs", "list", "--limit", "1", env=env)
    assert code == 0 and "more: z9 jobs list --after pg_" in err, err
    page1 = (await _ok("jobs", "list", "--limit", "2", env=env))
    page2 = (await _ok("jobs", "list", "--limit", "2", "--after", page1["next_after"], env=env))
    assert [j["id"] for j in page1["jobs"] + page2["jobs"]] == [j["id"] for j in jobs]


async def test_name_lookups_skip_deleted_ones_and_quota_show(stack: Stack, tmp_path: Path) -> None:
    env = client_env(stack, tmp_path)
    old = (await _ok(*CREATE, "--name", "web-1", "--wait", env=env))["server"]["id"]
    await stack.pool.execute("UPDATE servers SET status = 'deleted', deleted_at = now() WHERE id = $1", old)
    new = (await _ok(*CREATE, "--name", "web-1", env=env))["server"]["id"]
    assert [s["id"] for s in (await _ok("servers", "list", "--name", "web-1", env=env))["servers"]] == [new]
    both = (await _ok("servers", "list", "--name", "web-1", "--include-deleted", env=env))["servers"]
    assert [s["id"] for s in both] == sorted([old, new])
    assert [s["id"] for s in (await _ok("servers", "list", "--status", "deleted", env=env))["servers"]] == [old]
    # the API: a name lookup leaves the deleted ones out unless asked for
    status, body = await stack.call("GET", "/servers?name=web-1")
    assert status == 200 and [s["id"] for s in body["servers"]] == [new]
    status, body = await stack.call("GET", "/servers?name=web-1&include_deleted=true")
    assert len(body["servers"]) == 2

    await stack.pool.execute(
        "INSERT INTO tenant_quota_limits (tenant_id, unit, quota) SELECT tenant_id, 'servers', 5 FROM servers WHERE id = $1",
        new)
    q = await _ok("quota", "show", env=env)
    assert q["quotas"]["servers"] == {"limit": 5, "used": 1}, q  # the deleted one counts no more
    assert q["quotas"]["cores"]["used"] == 1 and q["quotas"]["cores"]["limit"] is None
    code, table, err = await z9("quota", "show", env=env)
    assert code == 0 and "servers" in table and "5" in table, (table, err)
    assert (await asyncio.to_thread(Client(stack.base, stack.token).get_quota)).quotas["servers"]["used"] == 1


async def test_jobs_cancel_and_rerun_print_the_apis_answers(api: Stack, tmp_path: Path) -> None:
    """No executor: the create's job stays pending, is cancelled, then re-run."""
    env = client_env(api, tmp_path)
    job = (await _ok(*CREATE, "--name", "jc-1", env=env))["job"]
    out = await _ok("jobs", "cancel", job["id"], env=env)
    assert set(out) == {"job"} and out["job"]["status"] == "failed" and out["job"]["error"]["class"] == "cancelled"
    out = await _ok("jobs", "rerun", job["id"], env=env)
    assert set(out) == {"job", "jobs"} and out["job"]["status"] == "pending" and out["job"]["id"] != job["id"], out
    assert out["jobs"] == [out["job"]], out  # the API's answer: every job the re-run made
    failed = (await _ok("jobs", "list", "--status", "failed", env=env))["jobs"]
    assert [j["id"] for j in failed] == [job["id"]]
