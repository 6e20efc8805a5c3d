"""Hostile and chaos probes of issue 11's clusters: each test is a defect found and fixed."""
from __future__ import annotations

import itertools
import time
from typing import Any

import pytest

from z9.common.tags import identity_tag, normalize_tags
from z9.resources.cluster.jobs import shared as _cluster

from tests.support import REGION, SimAdmin, Stack, api_stack
from tests.integration.clusters.test_clusters_e2e import K8S_TIMING, cluster, resize


def body(name: str = "prod", pools: list[dict[str, Any]] | None = None, cps: int = 1) -> dict[str, Any]:
    return {"name": name, "region": REGION, "version": "1.33",
            "control_plane": {"count": cps, "cores": 2, "memory_mib": 2048, "disk_gib": 10},
            "node_pools": pools if pools is not None else [
                {"name": "workers", "count": 1, "cores": 1, "memory_mib": 1024, "disk_gib": 10}]}


def pool(name: str, count: int = 1) -> dict[str, Any]:
    return {"name": name, "count": count, "cores": 1, "memory_mib": 1024, "disk_gib": 10}


# A member is <pool>-<ordinal> and the clone ledger (vm_clone_requests.member) holds at most 31
# characters: a pool name the API took (up to 31) made every member's clone a CheckViolation.
# Pool names are 1-28 characters now (room for "-99": counts are at most 100).
async def test_pool_name_leaves_room_for_the_ordinal(stack: Stack, sim: SimAdmin) -> None:
    status, out = await stack.call("POST", "/clusters", json=body(pools=[pool("p" * 29)]))
    assert status == 422 and "node_pools" in out["error"]["message"], out
    await sim.configure(**K8S_TIMING)
    status, out = await stack.call("POST", "/clusters", json=body(name="ok", pools=[pool("w" * 28)]))
    assert status == 202, out
    cid = out["cluster"]["id"]
    done = await stack.wait_job(out["job"]["id"], timeout_s=120)
    assert done["status"] == "succeeded", done
    assert [m["name"] for m in (await cluster(stack, cid))["members"]] == ["cp-0", "w" * 28 + "-0"]
    status, out = await stack.call("POST", f"/clusters/{cid}/actions/add-node-pool", json=pool("q" * 29))
    assert status == 422 and "name" in out["error"]["message"], out


# The create allows 16 node pools; add-node-pool let a 17th (and any number) in. The body of the
# 17th is valid (the document allows it): the cluster's state refuses it, a 409 like a load
# balancer's 17th service (resource_limit_exceeded). It was a 422 no schema can foresee, which
# schemathesis' positive_data_acceptance counts as a failure.
async def test_add_node_pool_keeps_the_pool_limit(api: Stack) -> None:
    status, out = await api.call("POST", "/clusters", json=body(pools=[pool(f"p{i}", 0) for i in range(16)]))
    assert status == 202, out
    cid = out["cluster"]["id"]
    status, out = await api.call("POST", f"/clusters/{cid}/actions/add-node-pool", json=pool("p16", 0))
    assert status == 409 and out["error"]["code"] == "resource_limit_exceeded", out
    assert "16 node pools" in out["error"]["message"], out


# The clone ledger keeps the vmid of a member whose VM was removed (scale-down); PVE hands that
# vmid out again — here to member a-1-0 of pool "a-1". When a-1 comes back, its ledger row points
# at a-1-0's VM, whose description holds "… member a-1-0", and the marker test was a substring
# test ("… member a-1" is in it): a-1 adopted a-1-0's VM and retagged it — one VM, two members.
@pytest.mark.settings(cluster_member_ready_s=20.0)
async def test_a_recycled_vmid_of_a_removed_member_is_not_adopted_by_prefix(stack: Stack, sim: SimAdmin) -> None:
    await sim.configure(**K8S_TIMING)
    status, out = await stack.call("POST", "/clusters", json=body(pools=[pool("a", 2), pool("a-1", 1)]))
    assert status == 202, out
    cid = out["cluster"]["id"]
    assert (await stack.wait_job(out["job"]["id"], timeout_s=120))["status"] == "succeeded"
    down = await stack.wait_job((await resize(stack, cid, 1, pool="a"))["id"], timeout_s=120)
    assert down["status"] == "succeeded", down
    other = next(m for m in (await cluster(stack, cid))["members"] if m["name"] == "a-1-0")
    # PVE recycled the removed a-1's vmid for a-1-0: the ledger row of a-1 names a-1-0's VM
    await stack.pool.execute("UPDATE vm_clone_requests SET vmid = $3, node = $4 WHERE resource_id = $1 "
                             "AND member = $2", cid, "a-1", other["vmid"], other["node"])
    up = await stack.wait_job((await resize(stack, cid, 2, pool="a"))["id"], timeout_s=120)
    assert up["status"] == "succeeded", up
    vm = await sim.vm(other["vmid"])
    assert "z9-member-a-1-0" in normalize_tags(vm["config"]["tags"]), vm["config"]["tags"]
    members = sorted(t for v in await sim.vms_tagged(identity_tag(cid)) for t in normalize_tags(v["config"]["tags"])
                     if t.startswith("z9-member-"))
    assert members == ["z9-member-a-0", "z9-member-a-1", "z9-member-a-1-0", "z9-member-cp-0"]
    assert (await cluster(stack, cid))["status"] == "running"


async def _our_isos(sim: SimAdmin, cid: str) -> list[str]:
    return [v["volid"] for vols in (await sim.state())["storage"].values() for v in vols if f"z9-{cid}-" in v["volid"]]


# A joiner's start fails after its ISO (token T1) was uploaded and attached; the next attempt,
# once T1 is older than half its ttl, mints T2 and builds a new ISO (new content, new name) and
# attaches that. The first ISO — the cluster CA and a join token — stayed on storage for good:
# nothing ever listed it again until the cluster's delete.
# The token's age is read from the executor's token clock, stepped here by more than half a ttl at
# every reading (each attempt comes "later"): the test once used a 2 s ttl and a 1.5 s backoff,
# and the simulator, holding z9 to that ttl, refused T2 when the loaded machine took over 2 s from
# its registration to the join (a permanent cloud-init failure).
async def test_a_reminted_token_leaves_no_orphan_iso(stack: Stack, sim: SimAdmin,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    await sim.configure(**K8S_TIMING)
    status, out = await stack.call("POST", "/clusters", json=body(pools=[pool("workers", 1)]))
    cid = out["cluster"]["id"]
    assert (await stack.wait_job(out["job"]["id"], timeout_s=120))["status"] == "succeeded"
    readings = itertools.count(1)
    step = stack.settings.cluster_join_token_ttl_s / 2 + 1
    monkeypatch.setattr(_cluster, "token_clock", lambda: time.time() + next(readings) * step)
    await sim.fault(method="POST", path=r"/status/start$", action="fail_task", exitstatus="start failed", times=1)
    up = await stack.wait_job((await resize(stack, cid, 2))["id"], timeout_s=120)
    assert up["status"] == "succeeded" and up["attempt"] >= 2, up
    assert (await sim.counters())["tasks_started"].get("imgcopy", 0) == 4  # cp-0, workers-0, workers-1 twice
    assert await _our_isos(sim, cid) == []
    assert (await cluster(stack, cid))["status"] == "running"


# A member whose cloud-init failed has its ISO deleted at once; here that deletion fails, so it
# keeps it; the pool is then scaled down instead. The removal destroyed the VM, then its ISO's
# deletion failed (a crash there is the same): the next attempt saw no extra member and planned
# nothing — the ISO (the cluster CA, a token) stayed.
async def test_a_removal_cut_short_before_the_iso_leaves_none(stack: Stack, sim: SimAdmin) -> None:
    await sim.configure(**K8S_TIMING)
    status, out = await stack.call("POST", "/clusters", json=body(pools=[pool("workers", 1)]))
    cid = out["cluster"]["id"]
    assert (await stack.wait_job(out["job"]["id"], timeout_s=120))["status"] == "succeeded"
    await sim._req("POST", "/guest-faults", json={"kind": "cloud_init_fails", "name": "prod-workers-1",
                                                   "message": "runcmd exploded"})
    # the failed member's ISO deletion fails, and so does the removal's later
    await sim.fault(method="DELETE", path=r"/storage/.*/content/", action="fail_task", exitstatus="got timeout",
                    times=2)
    up = await stack.wait_job((await resize(stack, cid, 2))["id"], timeout_s=120)
    assert up["status"] == "failed" and "runcmd exploded" in up["error"]["message"], up
    assert len(await _our_isos(sim, cid)) == 1  # its deletion failed: the failed member still holds its ISO
    await sim._req("DELETE", "/guest-faults")
    down = await stack.wait_job((await resize(stack, cid, 1))["id"], timeout_s=120)
    assert down["status"] == "succeeded", down
    assert await _our_isos(sim, cid) == []
    assert "delete_isos" in [s["name"] for s in down["steps"]], down["steps"]


# expiry_s took whatever int() takes ("6_00", " 600", "+600", other scripts' digits); a second
# DELETE of a cluster said "its deletion buffer has expired" — a cluster has no buffer.
async def test_expiry_digits_only_and_a_second_delete_names_no_buffer(api: Stack) -> None:
    status, out = await api.call("POST", "/clusters", json=body())
    cid = out["cluster"]["id"]
    await api.pool.execute("UPDATE clusters SET status = 'running', initialized_at = now() WHERE id = $1", cid)
    for bad in ("6_00", " 600", "+600", "\u0666\u0660\u0660", "0", "-60", "59", "31536001", "abc", ""):
        status, out = await api.call("GET", f"/clusters/{cid}/kubeconfig", params={"expiry_s": bad})
        assert status == 422 and out["error"]["details"][0]["field"] == "expiry_s", (bad, out)
    status, out = await api.call("GET", f"/clusters/{cid}/kubeconfig", params={"expiry_s": "60"})
    assert status == 200, out
    status, out = await api.call("DELETE", f"/clusters/{cid}")
    assert status == 202, out
    status, out = await api.call("DELETE", f"/clusters/{cid}")
    assert status == 409 and "already being destroyed" in out["error"]["message"], out
    assert "buffer" not in out["error"]["message"]
    status, out = await api.call("GET", f"/clusters/{cid}/kubeconfig")
    assert status == 409 and out["error"]["code"] == "resource_deleting", out


# The installation key replaced by another valid one (a rotation, a restored backup): the
# kubeconfig route opened the sealed keys unguarded — SealError, 500. Now 503 naming the setting.
async def test_kubeconfig_with_another_installation_key_is_503_naming_the_setting(api: Stack) -> None:
    import base64
    import os

    from pydantic import SecretStr

    status, out = await api.call("POST", "/clusters", json=body())
    cid = out["cluster"]["id"]
    await api.pool.execute("UPDATE clusters SET status = 'running', initialized_at = now() WHERE id = $1", cid)
    # the same database served by an API started with another key, then by one with none
    other_key = SecretStr(base64.b64encode(os.urandom(32)).decode())
    async with api_stack(api.settings.model_copy(update={"installation_key": other_key}), api.pool) as rotated:
        status, out = await rotated.call("GET", f"/clusters/{cid}/kubeconfig")
        assert status == 503 and "Z9_INSTALLATION_KEY" in out["error"]["message"], (status, out)
    async with api_stack(api.settings.model_copy(update={"installation_key": None}), api.pool) as keyless:
        status, out = await keyless.call("GET", f"/clusters/{cid}/kubeconfig")
        assert status == 503 and "Z9_INSTALLATION_KEY" in out["error"]["message"], (status, out)
        status, out = await keyless.call("POST", "/clusters", json=body(name="nokey"))
        assert status == 503 and "Z9_INSTALLATION_KEY" in out["error"]["message"], (status, out)


# A scale-up whose new members were cloned but not tagged yet (their configure failed; a crash
# there is the same) is shrunk back before its retry: the retry saw neither member desired nor any
# VM tagged for it — the untagged clones (marker only) stayed, running up cost no one saw, until
# the cluster's delete.
async def test_untagged_clones_of_members_no_longer_desired_are_removed(stack: Stack, sim: SimAdmin) -> None:
    await sim.configure(**K8S_TIMING)
    status, out = await stack.call("POST", "/clusters", json=body(pools=[pool("workers", 1)]))
    cid = out["cluster"]["id"]
    assert (await stack.wait_job(out["job"]["id"], timeout_s=120))["status"] == "succeeded"
    # a slow backoff (no job runs now: the executor restarts with it) while the scale-up waits for its retry
    await stack.restart_service("executor", backoff_base_s=3.0)
    # (the member's configure writes with PUT /config, synchronously: its failure is the answer)
    await sim.fault(method="PUT", path=r"/qemu/\d+/config$", action="error", status=500, reason="got timeout",
                    times=2)
    up = (await resize(stack, cid, 3))["id"]

    async def retrying() -> bool:
        return (await stack.job(up))["status"] == "retry"
    from tests.support import wait_until
    await wait_until(retrying, 60, "the scale-up waiting for its retry")
    await stack.call("POST", f"/clusters/{cid}/actions/resize-node-pool", json={"pool": "workers", "count": 1})
    for j in [j for j in (await stack.call("GET", f"/jobs?resource_id={cid}"))[1]["jobs"] if j["kind"] == "ClusterReconcile"]:
        assert (await stack.wait_job(j["id"], timeout_s=120))["status"] == "succeeded"
    ours = [v for v in (await sim.state())["vms"] if f"z9 resource {cid}" in str(v["config"].get("description", ""))]
    assert sorted(v["config"]["name"] for v in ours) == ["prod-cp-0", "prod-workers-0"], [
        (v["vmid"], v["config"].get("name"), v["config"].get("tags")) for v in ours]


# An unknown endpoint pool answered 422 naming "pool" — the cluster's body calls it address_pool.
async def test_unknown_address_pool_names_address_pool(api: Stack) -> None:
    status, out = await api.call("POST", "/clusters", json={**body(), "address_pool": "nope"})
    assert status == 422 and out["error"]["message"].startswith("address_pool:"), out
    assert out["error"]["details"][0]["field"] == "address_pool", out
