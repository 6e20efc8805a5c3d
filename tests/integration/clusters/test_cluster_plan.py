"""A cluster's plan (``POST /v1/clusters/{id}/actions/plan``): its reconcile's own observe and plan, read
only, against the simulator over HTTPS (its guest and kubeadm/kubectl models). Untouched, it plans in
sync every time; a member stopped by hand through PVE's API shows as exactly that drift with the join
step that starts it again; after the reconcile ran, in sync again. A plan sends no write to Proxmox: its
only POSTs are the guest agent's ``exec`` of commands that read (``kubectl get nodes``, ``cloud-init
status``, ``cat`` a log), which a read-only client sends for a caller that says so."""
from __future__ import annotations

import asyncio
from typing import Any

from proxmoxer import ProxmoxAPI
from z9.common import store
from z9.common.tags import identity_tag

from tests.integration.clusters.test_clusters_e2e import running
from tests.support import REGION, SimAdmin, Stack, wait_until


def _pve(sim: SimAdmin) -> ProxmoxAPI:
    return ProxmoxAPI("127.0.0.1", port=sim.server.port, user="root@pam", token_name="z9",
                      token_value=sim.server.token_secret, verify_ssl=str(sim.server.cert_path))


async def _plan(stack: Stack, cid: str) -> dict[str, Any]:
    status, body = await stack.call("POST", f"/clusters/{cid}/actions/plan")
    assert status == 200, body
    return body


async def _writes(sim: SimAdmin, since: int) -> list[dict[str, Any]]:
    return [r for r in (await sim.requests())[since:] if r["method"] != "GET" and not r["path"].endswith("/agent/exec")]


async def test_untouched_cluster_plans_in_sync_ten_times_without_a_write(stack: Stack, sim: SimAdmin) -> None:
    c, _ = await running(stack, sim, cps=1, workers=1)
    seen = len(await sim.requests())
    for _ in range(10):
        assert await _plan(stack, c["id"]) == {"in_sync": True, "job_kind": "ClusterReconcile", "drift": [],
                                               "steps": [], "blocked_by": [], "waiting": None}
    assert await _writes(sim, seen) == []


async def test_member_stopped_by_hand_is_the_drift_and_the_reconcile_starts_it(stack: Stack, sim: SimAdmin) -> None:
    c, _ = await running(stack, sim, cps=1, workers=1)
    vm = next(v for v in await sim.vms_tagged(identity_tag(c["id"])) if "z9-member-workers-0" in v["config"]["tags"])
    await asyncio.to_thread(lambda: _pve(sim).nodes(vm["node"]).qemu(vm["vmid"]).status.stop.post())

    async def stopped() -> bool:
        return not (await sim.vm(vm["vmid"]))["running"]
    await wait_until(stopped, 20, "the member stopped")
    seen = len(await sim.requests())
    plan = await _plan(stack, c["id"])
    assert plan["drift"] == [{"path": "members.workers-0.ready", "want": True, "have": False},
                             {"path": "members.workers-0.power", "want": "running", "have": "stopped"}]
    assert [(s["name"], s["disruptive"]) for s in plan["steps"]] == [("join", False)]
    assert await _writes(sim, seen) == []
    async with stack.pool.acquire() as conn, conn.transaction():
        job = await store.job_insert(conn, store.NewJob(kind="ClusterReconcile", region=REGION, tenant_id=stack.tenant_id,
                                                         resource_type="cluster", resource_id=c["id"], args={}))
    assert (await stack.wait_job(job.id, timeout_s=120))["status"] == "succeeded"
    assert (await _plan(stack, c["id"]))["in_sync"] is True
