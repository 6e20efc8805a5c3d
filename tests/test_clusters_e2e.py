"""Kubernetes clusters end to end (issue 11, tests 1-7): the API, the jobs, the simulator's guest
model and its kubeadm/kubectl model over HTTPS. What the model knows comes from the ISO bytes z9
uploaded; assertions are on the world (VMs, storage, the model's cluster) and the database."""
from __future__ import annotations

import asyncio
import re
import base64
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec

from z9.common.tags import identity_tag, normalize_tags

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
    # the kubeconfig's client certificate is signed by the CA the model was given (from the ISO)
    status, kc = await stack.call("GET", f"/clusters/{c['id']}/kubeconfig?expiry_s=600")
    assert status == 200, kc
    doc = yaml.safe_load(kc["kubeconfig"])
    assert doc["clusters"][0]["cluster"]["server"] == f"https://{c['endpoint']['address']}:6443"
    crt = x509.load_pem_x509_certificate(base64.b64decode(doc["users"][0]["user"]["client-certificate-data"]))
    ca = x509.load_pem_x509_certificate(k["ca_crt"].encode())
    ca.public_key().verify(crt.signature, crt.tbs_certificate_bytes, ec.ECDSA(crt.signature_hash_algorithm))
    assert crt.issuer == ca.subject
    lifetime = crt.not_valid_after_utc - crt.not_valid_before_utc
    assert 590 <= lifetime.total_seconds() <= 910  # 600 s (+ 5 min backdating for clock skew)
    # each joiner used its own token
    tokens = [n.get("token") for n in k["nodes"].values() if n.get("token")]
    assert len(tokens) == 4 and len(set(tokens)) == 4


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
