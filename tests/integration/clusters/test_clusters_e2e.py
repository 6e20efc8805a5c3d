"""Kubernetes clusters end to end (issue 11, tests 1-7): the API, the jobs, the simulator's guest
model and its kubeadm/kubectl model over HTTPS. What the model knows comes from the ISO bytes z9
uploaded; assertions are on the world (VMs, storage, the model's cluster) and the database."""
from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import base64
from typing import Any

import pytest
import yaml
from cryptography import x509

from z9.common.tags import identity_tag, normalize_tags
from z9.sim.server import KUBERNETES_IMAGES

from tests.support import REGION, SimAdmin, Stack, wait_until

K8S_TIMING = {"guest_boot_s": 0.2, "cloud_init_s": 0.2, "k8s_api_delay_s": 0.3}


def body(name: str = "prod", cps: int = 3, workers: int = 2) -> dict[str, Any]:
    return {"name": name, "region": REGION, "version": "1.33",
            "control_plane": {"count": cps, "cores": 2, "memory_mib": 4096, "disk_gib": 30},
            "node_pools": [{"name": "workers", "count": workers, "cores": 2, "memory_mib": 2048, "disk_gib": 20}]}


async def create(stack: Stack, sim: SimAdmin, **kw: Any) -> tuple[dict, dict]:
    await sim.configure(**K8S_TIMING)
    status, out = await stack.call("POST", "/clusters", json=body(**kw))
    assert status == 202, out
    return out["cluster"], out["job"]


async def cluster(stack: Stack, cid: str) -> dict:
    status, out = await stack.call("GET", f"/clusters/{cid}")
    assert status == 200, out
    return out["cluster"]


async def model(sim: SimAdmin) -> dict:
    return await sim._req("GET", "/k8s/clusters")


async def isos(sim: SimAdmin) -> list[str]:
    """Every volume on every storage (``{"isos": [...], "local@pve1": [...]}`` in the admin state)."""
    return [v["volid"] for vols in (await sim.state())["storage"].values() for v in vols]


async def running(stack: Stack, sim: SimAdmin, **kw: Any) -> tuple[dict, dict]:
    c, job = await create(stack, sim, **kw)
    done = await stack.wait_job(job["id"], timeout_s=120)
    assert done["status"] == "succeeded", done
    return await cluster(stack, c["id"]), done


async def _our_isos(sim: SimAdmin, cid: str) -> list[str]:
    return [v for v in await isos(sim) if f"z9-{cid}-" in v]


# 1
async def test_create_three_plus_two(stack: Stack, sim: SimAdmin) -> None:
    c, job = await running(stack, sim)
    assert [s["name"] for s in job["steps"]] == ["init", "join"]
    vms = await sim.vms_tagged(identity_tag(c["id"]))
    assert sorted(t for v in vms for t in normalize_tags(v["config"]["tags"]) if t.startswith("z9-member-")) == [
        "z9-member-cp-0", "z9-member-cp-1", "z9-member-cp-2", "z9-member-workers-0", "z9-member-workers-1"]
    for v in vms:
        assert {identity_tag(c["id"]), "z9-role-customer"} <= normalize_tags(v["config"]["tags"])
        assert v["running"]
    assert c["status"] == "running"
    assert [(m["name"], m["role"], m["pool"], m["ready"], m["power_state"]) for m in c["members"]] == [
        ("cp-0", "control-plane", None, True, "running"), ("cp-1", "control-plane", None, True, "running"),
        ("cp-2", "control-plane", None, True, "running"), ("workers-0", "worker", "workers", True, "running"),
        ("workers-1", "worker", "workers", True, "running")]
    assert all(m["node"] and m["vmid"] and m["address"] for m in c["members"])
    # the model's cluster: every member a node, the endpoint the allocated address
    k = (await model(sim))[f"{c['endpoint']['address']}:6443"]
    assert sorted(k["nodes"]) == ["cp-0", "cp-1", "cp-2", "workers-0", "workers-1"]
    # the kubeconfig names the CA the model was given (from the ISO); its client certificate is
    # signed by the users' client CA, which the model's API servers trust (tests/integration/clusters/test_kubeconfig_credentials.py)
    status, kc = await stack.call("GET", f"/clusters/{c['id']}/kubeconfig?expiry_s=600")
    assert status == 200, kc
    doc = yaml.safe_load(kc["kubeconfig"])
    assert doc["clusters"][0]["cluster"]["server"] == f"https://{c['endpoint']['address']}:6443"
    assert base64.b64decode(doc["clusters"][0]["cluster"]["certificate-authority-data"]).decode() == k["ca_crt"]
    crt = x509.load_pem_x509_certificate(base64.b64decode(doc["users"][0]["user"]["client-certificate-data"]))
    from tests.integration.clusters.test_kubeconfig_credentials import _kubectl
    cp0 = next(m for m in c["members"] if m["name"] == "cp-0")
    assert await _kubectl(sim, cp0["node"], cp0["vmid"], kc["kubeconfig"]) == (0, "ok")
    lifetime = crt.not_valid_after_utc - crt.not_valid_before_utc
    assert 590 <= lifetime.total_seconds() <= 910  # 600 s (+ 5 min backdating for clock skew)
    # each joiner used its own token
    tokens = [n.get("token") for n in k["nodes"].values() if n.get("token")]
    assert len(tokens) == 4 and len(set(tokens)) == 4


def two_pools(name: str, version: str, cps: int) -> dict[str, Any]:
    return {"name": name, "region": REGION, "version": version,
            "control_plane": {"count": cps, "cores": 2, "memory_mib": 2048, "disk_gib": 10},
            "node_pools": [{"name": "workers", "count": 1, "cores": 1, "memory_mib": 1024, "disk_gib": 10},
                           {"name": "batch", "count": 1, "cores": 1, "memory_mib": 1024, "disk_gib": 10}]}


async def _strictly_built(stack: Stack, sim: SimAdmin, cid: str, version: str) -> None:
    """What the kubeadm model saw is what z9 must build: one seed per member (z9's ISO, no Proxmox
    cloud-init drive), the config API of the version, kube-vip on every control plane, a pod network."""
    c = await cluster(stack, cid)
    assert c["status"] == "running" and all(m["ready"] for m in c["members"]), c
    k = (await model(sim))[f"{c['endpoint']['address']}:6443"]
    assert k["cni"]["name"] == "flannel" and k["cni"]["version"] == "v0.26.1" and k["pod_subnet"] == "10.244.0.0/16"
    # applied from the manifest the seed shipped, not fetched
    assert k["cni"]["source"] == "/etc/z9/kube-flannel.yml" and k["cni"]["network"] == "10.244.0.0/16", k["cni"]
    assert k["minor"] == int(version.split(".")[1])
    # built from the image of that minor, kubeadm asked for exactly the release it carries
    assert c["image"] == f"debian-12-k8s-{version}" and k["version"] == f"v{KUBERNETES_IMAGES[c['image']]}", (c, k)
    for m in c["members"]:
        vm = await sim.vm(m["vmid"])
        assert not any("cloudinit" in str(v) for v in vm["config"].values()), vm["config"]  # one seed only
        g = await sim._req("GET", f"/guests/{m['vmid']}")
        assert g["inputs"]["source"].startswith("ide0:isos:iso/z9-"), g["inputs"]  # booted from z9's ISO
        assert g["cloud_init"]["status"] == "done", g["cloud_init"]
        api = "kubeadm.k8s.io/v1beta4" if int(version.split(".")[1]) >= 31 else "kubeadm.k8s.io/v1beta3"
        assert g["models"]["kubeadm"]["api_version"] == api, g["models"]["kubeadm"]
        if m["role"] == "control-plane":
            assert "/etc/kubernetes/manifests/kube-vip.yaml" in g["files"]
        else:
            assert "/etc/kubernetes/pki/ca.key" not in g["files"]


# Every offered version: 1 control plane and two pools reach running with the strict kubeadm model
# (its config API per minor, preflight, kube-vip, Ready only with a pod network).
@pytest.mark.parametrize("version", ["1.29", "1.30", "1.31", "1.32", "1.33", "1.34"])
async def test_one_control_plane_and_two_pools_on_every_version(stack: Stack, sim: SimAdmin, version: str) -> None:
    await sim.configure(**K8S_TIMING)
    status, out = await stack.call("POST", "/clusters", json=two_pools(f"v{version.replace('.', '-')}", version, 1))
    assert status == 202, out
    done = await stack.wait_job(out["job"]["id"], timeout_s=120)
    assert done["status"] == "succeeded", done
    await _strictly_built(stack, sim, out["cluster"]["id"], version)


# Three control planes (two of them joining as control planes: PKI, kube-vip after the join) and two
# pools, on a v1beta3 minor and on a v1beta4 one.
@pytest.mark.parametrize("version", ["1.30", "1.34"])
async def test_three_control_planes_and_two_pools(stack: Stack, sim: SimAdmin, version: str) -> None:
    await sim.configure(**K8S_TIMING)
    status, out = await stack.call("POST", "/clusters", json=two_pools("ha", version, 3))
    assert status == 202, out
    done = await stack.wait_job(out["job"]["id"], timeout_s=120)
    assert done["status"] == "succeeded", done
    await _strictly_built(stack, sim, out["cluster"]["id"], version)
    k = (await model(sim))[f"{(await cluster(stack, out['cluster']['id']))['endpoint']['address']}:6443"]
    assert len(k["control_planes"]) == 3


# 7
async def test_bootstrap_material_deleted_once_ready(stack: Stack, sim: SimAdmin) -> None:
    c, job = await create(stack, sim, cps=1, workers=1)
    # while cp-0 boots, its ISO (content-addressed name, never the vmid) is on the shared storage
    uploaded = await wait_until(lambda: _our_isos(sim, c["id"]), 30, "the bootstrap ISO uploaded")
    assert uploaded and all(re.fullmatch(rf"isos:iso/z9-{c['id']}-cp-0-[0-9a-f]{{16}}\.iso", v) for v in uploaded)
    done = await stack.wait_job(job["id"], timeout_s=120)
    assert done["status"] == "succeeded", done
    vms = await sim.vms_tagged(identity_tag(c["id"]))
    for v in vms:
        assert v["config"].get("ide0", "").startswith("none"), v["config"].get("ide0")
    left = [i for i in await isos(sim) if f"z9-{c['id']}" in i]
    assert left == []
    counters = await sim.counters()
    assert counters["tasks_started"].get("imgcopy", 0) == 2 and counters["tasks_started"].get("imgdel", 0) == 2


async def resize(stack: Stack, cid: str, count: int, pool: str = "workers") -> dict:
    status, out = await stack.call("POST", f"/clusters/{cid}/actions/resize-node-pool", json={"pool": pool, "count": count})
    assert status == 202, out
    assert out["cluster"]["status"] == "updating"
    return out["job"]


# 3
async def test_resize_pool_two_four_one(stack: Stack, sim: SimAdmin) -> None:
    c, _ = await running(stack, sim, cps=1, workers=2)
    ep = f"{c['endpoint']['address']}:6443"
    before = {n: v.get("token") for n, v in (await model(sim))[ep]["nodes"].items()}
    up = await stack.wait_job((await resize(stack, c["id"], 4))["id"], timeout_s=120)
    assert up["status"] == "succeeded", up
    k = (await model(sim))[ep]
    assert sorted(k["nodes"]) == ["cp-0", "workers-0", "workers-1", "workers-2", "workers-3"]
    new_tokens = {k["nodes"]["workers-2"]["token"], k["nodes"]["workers-3"]["token"]}
    assert len(new_tokens) == 2 and not new_tokens & set(before.values())  # fresh tokens, one each
    c = await cluster(stack, c["id"])
    assert c["status"] == "running" and [p["ready"] for p in c["node_pools"]] == [4]

    down = await stack.wait_job((await resize(stack, c["id"], 1))["id"], timeout_s=120)
    assert down["status"] == "succeeded", down
    assert [(s["name"], s["detail"].get("member")) for s in down["steps"]] == [
        ("drain", "workers-3"), ("remove", "workers-3"), ("drain", "workers-2"), ("remove", "workers-2"),
        ("drain", "workers-1"), ("remove", "workers-1")]
    events = [(e[0], e[1]) for e in (await model(sim))[ep]["events"] if e[0] in ("drain", "delete")]
    assert events == [("drain", "workers-3"), ("delete", "workers-3"), ("drain", "workers-2"), ("delete", "workers-2"),
                      ("drain", "workers-1"), ("delete", "workers-1")]
    vms = await sim.vms_tagged(identity_tag(c["id"]))
    assert sorted(t for v in vms for t in normalize_tags(v["config"]["tags"]) if t.startswith("z9-member-")) == [
        "z9-member-cp-0", "z9-member-workers-0"]
    c = await cluster(stack, c["id"])
    assert c["status"] == "running" and [m["name"] for m in c["members"]] == ["cp-0", "workers-0"]


# 4
async def test_delete_during_create_cancels_it(stack: Stack, sim: SimAdmin) -> None:
    c, job = await create(stack, sim)
    await sim.configure(cloud_init_s=1.5)  # a slower create: the DELETE lands while it works
    await wait_until(lambda: _step_running(stack, job["id"], "join"), 60, "the create's join step")
    status, out = await stack.call("DELETE", f"/clusters/{c['id']}")
    assert status == 202, out
    delete_job = out["job"]["id"]
    created = await stack.wait_job(job["id"], timeout_s=120)
    assert created["status"] == "failed"
    assert created["error"]["class"] == "cancelled" and delete_job in created["error"]["message"], created["error"]
    deleted = await stack.wait_job(delete_job, timeout_s=120)
    assert deleted["status"] == "succeeded", deleted
    assert await sim.vms_tagged(identity_tag(c["id"])) == []
    assert await _our_isos(sim, c["id"]) == []
    assert await stack.pool.fetchval("SELECT count(*) FROM cluster_keys WHERE cluster_id = $1", c["id"]) == 0
    adr = await stack.pool.fetchrow("SELECT status, ip FROM addresses WHERE id = $1", c["endpoint"]["address_id"])
    assert adr["status"] == "deleted"
    assert await stack.pool.fetchval("SELECT count(*) FROM address_pool_ips WHERE address_id = $1",
                                     c["endpoint"]["address_id"]) == 0
    assert (await cluster(stack, c["id"]))["status"] == "deleted"
    status, out = await stack.call("GET", f"/clusters/{c['id']}/kubeconfig")
    assert status == 409


async def _step_running(stack: Stack, job_id: str, name: str) -> bool:
    job = await stack.job(job_id)
    return any(s["name"] == name and s["state"] == "running" for s in job["steps"])


# 5
async def test_member_cloud_init_fails_create_failed_reconcile_degraded(stack: Stack, sim: SimAdmin) -> None:
    await sim._req("POST", "/guest-faults", json={"kind": "cloud_init_fails", "name": "bad-workers-1",
                                                   "message": "Failed to run module scripts_user (disk full)"})
    c, job = await create(stack, sim, name="bad", cps=1, workers=2)
    done = await stack.wait_job(job["id"], timeout_s=120)
    assert done["status"] == "failed"
    assert "workers-1" in done["error"]["message"] and "disk full" in done["error"]["message"], done["error"]
    c = await cluster(stack, c["id"])
    assert c["status"] == "failed" and "workers-1" in c["status_reason"]
    # the failed member's bootstrap ISO (its join token) is gone from storage; the others' were
    # deleted as they became Ready
    assert await _our_isos(sim, c["id"]) == []
    # and no join token is in clear in the database (sealed in the job's memo)
    memo = await stack.pool.fetchval("SELECT memo::text FROM jobs WHERE id = $1", job["id"])
    entries = {k: v for k, v in json.loads(memo).items() if k.startswith("token:")}
    assert entries and all({"key_id", "nonce", "sealed", "minted_at"} <= set(v) <= {"key_id", "nonce", "sealed", "minted_at",
                                                                                  "ttl_s"}
                           for v in entries.values()), entries  # ttl_s: a re-minted token's life
    for v in entries.values():
        assert not re.search(r"[a-z0-9]{6}\.[a-z0-9]{16}", json.dumps(v)), v

    await sim._req("DELETE", "/guest-faults")
    # the failed create re-run (POST /v1/jobs/{id}/actions/rerun) is safe and never calls the
    # failed member ready: (the model's fault fails cloud-init after kubeadm joined) it is drained
    # out of the cluster, replaced by a new instance with a fresh token, and the cluster runs
    status, out = await stack.call("POST", f"/jobs/{job['id']}/actions/rerun")
    assert status == 202 and out["job"]["kind"] == "ClusterCreate", out
    again = await stack.wait_job(out["job"]["id"], timeout_s=120)
    assert again["status"] == "succeeded", again
    assert [(s["name"], s["detail"].get("member") or s["detail"].get("members")) for s in again["steps"]] == [
        ("drain", "workers-1"), ("replace", "workers-1"), ("join", ["workers-1"])], again["steps"]
    c = await cluster(stack, c["id"])
    assert c["status"] == "running" and c["status_reason"] is None and all(m["ready"] for m in c["members"])
    assert len(await sim.vms_tagged(identity_tag(c["id"]))) == 3

    await sim._req("POST", "/guest-faults", json={"kind": "cloud_init_fails", "name": "good-workers-1",
                                                   "message": "runcmd exploded"})
    good, _ = await running(stack, sim, name="good", cps=1, workers=1)
    up = await stack.wait_job((await resize(stack, good["id"], 2))["id"], timeout_s=120)
    assert up["status"] == "failed" and "workers-1" in up["error"]["message"] and "runcmd exploded" in up["error"]["message"]
    good = await cluster(stack, good["id"])
    assert good["status"] == "degraded" and "workers-1" in good["status_reason"]


# 6
async def test_platform_vm_with_cluster_tag_refused_by_delete(stack: Stack, sim: SimAdmin) -> None:
    c, _ = await running(stack, sim, cps=1, workers=0)
    vm = (await sim.vms_tagged(identity_tag(c["id"])))[0]
    await sim.set_config(vm["vmid"], tags=vm["config"]["tags"] + ";z9-role-platform")
    status, out = await stack.call("DELETE", f"/clusters/{c['id']}")
    assert status == 202
    done = await stack.wait_job(out["job"]["id"], timeout_s=60)
    assert done["status"] == "failed" and "platform role" in done["error"]["message"] and done["error"].get("refused")
    assert await sim.vm(vm["vmid"]) is not None
    c = await cluster(stack, c["id"])
    assert c["status"] == "failed" and "platform role" in c["status_reason"]
    # its keys are kept (nothing was deleted): an operator can sort the VM out and delete again
    assert await stack.pool.fetchval("SELECT count(*) FROM cluster_keys WHERE cluster_id = $1", c["id"]) == 1
    # the failed delete is not re-run as a job (delete the cluster again instead)
    status, out = await stack.call("POST", f"/jobs/{done['id']}/actions/rerun")
    assert status == 409 and out["error"]["code"] == "job_not_rerunnable", out


def _executor(stack: Stack) -> subprocess.Popen:
    s = stack.settings
    env = dict(os.environ, Z9_DATABASE_URL=s.database_url, Z9_LEASE_TTL_S="2", Z9_HEARTBEAT_S="0.5",
               Z9_TASK_POLL_S="0.1", Z9_POLL_INTERVAL_S="0.5", Z9_BACKOFF_BASE_S="0.2", Z9_BACKOFF_CAP_S="1",
               Z9_INSTALLATION_KEY=s.installation_key.get_secret_value(), Z9_REGIONS=json.dumps(
                   {REGION: {"url": s.regions[REGION].url, "token_id": s.regions[REGION].token_id,
                             "token_secret": s.regions[REGION].token_secret.get_secret_value(), "verify_ssl": False,
                             "nameservers": [str(n) for n in s.regions[REGION].nameservers],
                             "kubernetes_images": s.regions[REGION].kubernetes_images}}))
    return subprocess.Popen([sys.executable, "-m", "z9", "executor", "--region", REGION], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


async def _tasks(sim: SimAdmin, kind: str) -> int:
    return (await sim.counters())["tasks_started"].get(kind, 0)


# 2
async def test_sigkill_executor_twice_during_create(stack: Stack, sim: SimAdmin) -> None:
    await stack.stop_service("executor")
    await sim.configure(**K8S_TIMING)
    await sim.configure(task_seconds={"qmclone": 1.0, "imgcopy": 1.0})
    procs = []
    try:
        procs.append(_executor(stack))
        c, job = await create(stack, sim)
        await sim.configure(task_seconds={"qmclone": 1.0, "imgcopy": 1.0})
        # kill 1: while cp-0's ISO upload (imgcopy) runs
        await wait_until(lambda: _at_least(sim, "imgcopy", 1), 60, "cp-0's upload")
        procs[-1].send_signal(signal.SIGKILL)
        procs[-1].wait(10)
        procs.append(_executor(stack))
        # kill 2: while the joiners' clones run
        await wait_until(lambda: _at_least(sim, "qmclone", 3), 60, "the joiners' clones")
        await asyncio.sleep(0.3)
        procs[-1].send_signal(signal.SIGKILL)
        procs[-1].wait(10)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    stack.reconfigure(lease_ttl_s=2)
    await stack.start_service("executor")
    done = await stack.wait_job(job["id"], timeout_s=180)
    assert done["status"] == "succeeded", done
    assert done["attempt"] >= 3
    vms = await sim.vms_tagged(identity_tag(c["id"]))
    assert len(vms) == 5 and all(v["running"] for v in vms)
    assert await _tasks(sim, "qmclone") == 5  # no second clone of any member
    assert await _tasks(sim, "imgcopy") == 5  # no second upload of any member's ISO
    assert (await cluster(stack, c["id"]))["status"] == "running"


async def _at_least(sim: SimAdmin, kind: str, n: int) -> bool:
    return await _tasks(sim, kind) >= n


# "every join uses a freshly minted, short-lived token; a scale-up a day after creation works":
# every token the cluster knew has expired (the model's fault), and the scale-up still joins.
async def test_scale_up_after_every_token_expired(stack: Stack, sim: SimAdmin) -> None:
    c, _ = await running(stack, sim, cps=1, workers=1)
    assert (await sim._req("POST", "/k8s/expire-tokens"))["expired"] >= 1
    up = await stack.wait_job((await resize(stack, c["id"], 2))["id"], timeout_s=120)
    assert up["status"] == "succeeded", up
    k = (await model(sim))[f"{c['endpoint']['address']}:6443"]
    assert k["nodes"]["workers-1"]["token"] != k["nodes"]["workers-0"]["token"]
    assert (await cluster(stack, c["id"]))["status"] == "running"


# Two VMs carrying one member tag (an operator's manual clone): a permanent error naming both.
async def test_two_vms_with_one_member_tag_is_a_permanent_error(stack: Stack, sim: SimAdmin) -> None:
    c, _ = await running(stack, sim, cps=1, workers=1)
    vm = next(v for v in await sim.vms_tagged(identity_tag(c["id"])) if "z9-member-workers-0" in v["config"]["tags"])
    await sim._req("POST", "/vms", json={"vmid": 777, "node": vm["node"], "running": False,
                                         "config": {"name": "copy", "tags": vm["config"]["tags"], "cores": "1",
                                                    "memory": "1024"}})
    # the executor's shared /cluster/resources snapshot may be resources_snapshot_s old: a VM made
    # just now is seen by the jobs claimed once a newer listing is taken
    await asyncio.sleep(stack.settings.regions[REGION].resources_snapshot_s + 0.5)
    job = await stack.wait_job((await resize(stack, c["id"], 1))["id"], timeout_s=60)
    assert job["status"] == "failed" and job["error"]["class"] == "permanent"
    assert "z9-member-workers-0" in job["error"]["message"]
    assert f"VM {vm['vmid']}" in job["error"]["message"] and "VM 777" in job["error"]["message"]


# A worker whose boot is held past its token's lifetime (its start task held while every token the
# cluster knows expires): kubeadm's discovery refuses the token ("could not find a JWS signature …"),
# the job reads that from the guest's own output log, mints a new token, swaps in a new ISO (the old
# one deleted) and reboots the same VM — the cluster ends running, no VM replaced, no ISO left.
async def test_a_worker_booting_after_its_token_expired_joins(stack: Stack, sim: SimAdmin) -> None:
    c, _ = await running(stack, sim, cps=1, workers=1)
    ep = f"{c['endpoint']['address']}:6443"
    destroyed, uploads = await _tasks(sim, "qmdestroy"), await _tasks(sim, "imgcopy")
    starts = await _tasks(sim, "qmstart")
    await sim.hold_tasks("qmstart")
    try:
        job = (await resize(stack, c["id"], 2))["id"]
        await wait_until(lambda: _at_least(sim, "qmstart", starts + 1), 60, "workers-1's start sent")
        first = set((await model(sim))[ep]["tokens"])
        assert (await sim._req("POST", "/k8s/expire-tokens"))["expired"] >= 2  # its lifetime passes meanwhile
    finally:
        await sim.release_tasks("qmstart")
    done = await stack.wait_job(job, timeout_s=120)
    assert done["status"] == "succeeded", done
    k = (await model(sim))[ep]
    assert sorted(k["nodes"]) == ["cp-0", "workers-0", "workers-1"]
    assert k["nodes"]["workers-1"]["token"] not in {t.split(".")[0] for t in first}  # it joined with a new one
    vm = next(v for v in await sim.vms_tagged(identity_tag(c["id"])) if "z9-member-workers-1" in v["config"]["tags"])
    assert k["nodes"]["workers-1"]["vmid"] == vm["vmid"]
    assert await _tasks(sim, "qmdestroy") == destroyed  # the same VM joined: nothing replaced
    assert await _tasks(sim, "qmreboot") >= 1
    assert await _tasks(sim, "imgcopy") == uploads + 2  # its first ISO, then the one with the new token
    assert await _our_isos(sim, c["id"]) == []
    assert len(await sim.vms_tagged(identity_tag(c["id"]))) == 3
    assert (await cluster(stack, c["id"]))["status"] == "running"


async def _started(sim: SimAdmin, name: str) -> bool:
    return any(v["config"].get("name") == name and v["running"] for v in (await sim.state())["vms"])


# The endpoint address belongs to the cluster: not deletable through /v1/addresses, even with its
# protection turned off; the cluster's delete releases it.
async def test_endpoint_address_is_the_clusters(stack: Stack, sim: SimAdmin) -> None:
    c, _ = await create(stack, sim, cps=1, workers=0)
    aid = c["endpoint"]["address_id"]
    status, out = await stack.call("GET", f"/addresses/{aid}")
    assert status == 200 and out["address"]["status"] == "active" and out["address"]["ip"] == c["endpoint"]["address"]
    status, out = await stack.call("DELETE", f"/addresses/{aid}")
    assert status == 409 and out["error"]["code"] == "cluster_endpoint", out
    status, _ = await stack.call("PATCH", f"/addresses/{aid}", json={"protection": {"delete": False}})
    assert status == 200
    status, out = await stack.call("DELETE", f"/addresses/{aid}")
    assert status == 409 and out["error"]["code"] == "cluster_endpoint", out
    # nor assigned to one of the tenant's servers (it would take the endpoint away from the cluster)
    srv, _ = await stack.create_server("taker")
    status, out = await stack.call("POST", f"/addresses/{aid}/actions/assign", json={"server_id": srv["id"]})
    assert status == 409 and out["error"]["code"] == "cluster_endpoint", out
    status, out = await stack.call("GET", f"/addresses/{aid}")
    assert out["address"]["server_id"] is None and out["address"]["status"] == "active", out


# Node pools: add one (its members join with fresh tokens, in parallel), then remove it — its
# members drained and removed highest ordinal first, the other pool untouched.
async def test_add_then_remove_a_node_pool(stack: Stack, sim: SimAdmin) -> None:
    c, _ = await running(stack, sim, cps=1, workers=1)
    ep = f"{c['endpoint']['address']}:6443"
    status, out = await stack.call("POST", f"/clusters/{c['id']}/actions/add-node-pool",
                                   json={"name": "batch", "count": 2, "cores": 1, "memory_mib": 1024, "disk_gib": 10})
    assert status == 202 and out["cluster"]["status"] == "updating", out
    added = await stack.wait_job(out["job"]["id"], timeout_s=120)
    assert added["status"] == "succeeded", added
    assert [(s["name"], s["detail"].get("members")) for s in added["steps"]] == [("join", ["batch-0", "batch-1"])]
    k = (await model(sim))[ep]
    assert sorted(k["nodes"]) == ["batch-0", "batch-1", "cp-0", "workers-0"]
    assert len({k["nodes"][n]["token"] for n in ("workers-0", "batch-0", "batch-1")}) == 3
    c = await cluster(stack, c["id"])
    assert c["status"] == "running" and [(p["name"], p["count"], p["ready"]) for p in c["node_pools"]] == [
        ("workers", 1, 1), ("batch", 2, 2)]
    batch = [m for m in c["members"] if m["pool"] == "batch"]
    assert [(m["name"], m["role"], m["ready"]) for m in batch] == [("batch-0", "worker", True), ("batch-1", "worker", True)]
    vm = next(v for v in await sim.vms_tagged(identity_tag(c["id"])) if "z9-member-batch-0" in v["config"]["tags"])
    assert (vm["config"]["cores"], vm["config"]["memory"]) in (("1", "1024"), (1, 1024))

    status, out = await stack.call("POST", f"/clusters/{c['id']}/actions/remove-node-pool", json={"pool": "batch"})
    assert status == 202, out
    removed = await stack.wait_job(out["job"]["id"], timeout_s=120)
    assert removed["status"] == "succeeded", removed
    assert [(s["name"], s["detail"].get("member")) for s in removed["steps"]] == [
        ("drain", "batch-1"), ("remove", "batch-1"), ("drain", "batch-0"), ("remove", "batch-0")]
    assert sorted((await model(sim))[ep]["nodes"]) == ["cp-0", "workers-0"]
    c = await cluster(stack, c["id"])
    assert c["status"] == "running" and [m["name"] for m in c["members"]] == ["cp-0", "workers-0"]
    assert [p["name"] for p in c["node_pools"]] == ["workers"]
    assert len(await sim.vms_tagged(identity_tag(c["id"]))) == 2


async def _pve(sim: SimAdmin, method: str, path: str) -> Any:
    """An out-of-band request to the simulated PVE API (an operator's tool, a crash)."""
    import aiohttp

    srv = sim.server
    auth = {"Authorization": f"PVEAPIToken={srv.token_id}={srv.token_secret}"}
    async with aiohttp.ClientSession() as http:
        async with http.request(method, f"{srv.url}/api2/json{path}", headers=auth, ssl=False) as r:
            assert r.status == 200, await r.text()
            return (await r.json())["data"]


# "A cluster whose quorum is fine but one node is not Ready is degraded": a worker's VM stops out
# of band; the periodic ClusterObserve reports it (member stopped, not Ready; cluster degraded
# naming it); a reconcile starts it again and the next observation says running.
async def test_periodic_observe_reports_a_stopped_member_degraded(stack: Stack, sim: SimAdmin) -> None:
    c, _ = await running(stack, sim, cps=1, workers=2)
    await stack.restart_service("reaper", cluster_observe_interval_s=1.0)
    w1 = next(m for m in c["members"] if m["name"] == "workers-1")
    await _pve(sim, "POST", f"/nodes/{w1['node']}/qemu/{w1['vmid']}/status/stop")

    async def degraded() -> dict | None:
        cur = await cluster(stack, c["id"])
        return cur if cur["status"] == "degraded" else None
    cur = await wait_until(degraded, 30, "the cluster degraded")
    assert cur["status_reason"] == "not a Ready node: workers-1 (stopped)", cur
    ms = {m["name"]: m for m in cur["members"]}
    assert (ms["workers-1"]["power_state"], ms["workers-1"]["ready"]) == ("stopped", False)
    assert all(ms[n]["ready"] for n in ("cp-0", "workers-0"))
    status, out = await stack.call("GET", f"/jobs?resource_id={c['id']}")
    observes = [j for j in out["jobs"] if j["kind"] == "ClusterObserve"]
    assert observes and all(j["steps"] == [] for j in observes)  # observe only: nothing done to the world
    # the kubeconfig is still minted (the cluster was whole once)
    status, _ = await stack.call("GET", f"/clusters/{c['id']}/kubeconfig")
    assert status == 200

    # a reconcile (the same shape) starts the member again; the next look says running
    job = await stack.wait_job((await resize(stack, c["id"], 2))["id"], timeout_s=120)
    assert job["status"] == "succeeded", job

    async def healthy() -> dict | None:
        cur = await cluster(stack, c["id"])
        return cur if cur["status"] == "running" and all(m["ready"] for m in cur["members"]) else None
    cur = await wait_until(healthy, 30, "the cluster running again")
    assert cur["status_reason"] is None


# The catalogue names a release the image does not carry (a patch apart: kubeadm's own skew checks
# pass it): the members' kubeadm says otherwise, and the create fails naming the member, the binary,
# what it is and what the catalogue says — the cluster is not called running on another release.
@pytest.mark.settings(region={"kubernetes_images": {"debian-12-k8s-1.33": "1.33.9"}})
async def test_an_image_that_does_not_carry_its_declared_release_fails_verify(stack: Stack, sim: SimAdmin) -> None:
    c, job = await create(stack, sim, name="wrong", cps=1, workers=0)
    done = await stack.wait_job(job["id"], timeout_s=120)
    assert done["status"] == "failed", done
    msg = done["error"]["message"]
    assert "cp-0" in msg and "kubeadm is v1.33.5" in msg and "v1.33.9" in msg and "kubernetes_images" in msg, msg
