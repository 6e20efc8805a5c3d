"""Hostile and chaos probes of issue 11's clusters (breakk8s): each test is a defect found and fixed."""
from __future__ import annotations

from typing import Any

from z9.common.tags import identity_tag, normalize_tags

from tests.support import REGION, SimAdmin, Stack
from tests.test_clusters_e2e import K8S_TIMING, cluster, resize


def body(name: str = "prod", pools: list[dict[str, Any]] | None = None, cps: int = 1) -> dict[str, Any]:
    return {"name": name, "region": REGION, "version": "1.33",
            "control_plane": {"count": cps, "cores": 1, "memory_mib": 1024, "disk_gib": 10},
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


# The create allows 16 node pools; add-node-pool let a 17th (and any number) in.
async def test_add_node_pool_keeps_the_pool_limit(api: Stack) -> None:
    status, out = await api.call("POST", "/clusters", json=body(pools=[pool(f"p{i}", 0) for i in range(16)]))
    assert status == 202, out
    cid = out["cluster"]["id"]
    status, out = await api.call("POST", f"/clusters/{cid}/actions/add-node-pool", json=pool("p16", 0))
    assert status == 422 and "node_pools" in out["error"]["message"], out
