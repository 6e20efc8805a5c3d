"""a create's lookups take a /cluster/resources snapshot up to resources_snapshot_create_s
(30 s) old and answer "no VM" from the clone ledger, each entry read at the node it recorded. A VM
z9 cloned for the member and then moved to another node (an operator's migration, an HA
relocation after a node failure) is at neither place the create looks: the snapshot is older than
the VM, the ledger's node no longer has it. The create then clones a second VM for the server.
"""
from __future__ import annotations

import time
from types import SimpleNamespace

from z9.common.settings import Settings
from z9.common.tags import customer_vm_tags, format_tags
from z9.executor import vms
from z9.executor.proxmox import ProxmoxClient

from tests.support import REGION, SimAdmin


async def test_a_create_finds_its_vm_moved_to_another_node_after_an_old_snapshot(
        settings: Settings, sim: SimAdmin, pool) -> None:
    pve = ProxmoxClient(REGION, settings.regions[REGION].model_copy(
        update={"resources_snapshot_s": 2.0, "resources_snapshot_create_s": 30.0}))
    try:
        await pve.list_vms()  # this process's snapshot, taken before the server's VM exists
        nodes = sorted((await sim.state())["node_ports"])
        assert len(nodes) >= 2, nodes
        owner, vmid = "srv_break13moved", 4321
        spec = vms.VmSpec(owner=owner, member=vms.MAIN, name="moved-1", image="debian-12", cores=1,
                          memory_mib=512, disk_gib=10)
        cfg = dict(spec.desired_config(), description=spec.marker, scsi0="local-lvm:vm-4321-disk-0,size=10G")
        # another executor process cloned and tagged it on nodes[0] (its ledger row says so) …
        await sim._req("POST", "/vms", json={"vmid": vmid, "node": nodes[0], "running": True, "config": cfg})
        await pool.execute("INSERT INTO vm_clone_requests (resource_id, member, vmid, node, job_id, answered_at, upid)"
                           " VALUES ($1, 'main', $2, $3, 'job_break13', now(), $4)", owner, vmid, nodes[0],
                           f"UPID:{nodes[0]}:00001234:00001234:00000000:qmclone:100:root@pam:")
        # … then it was migrated to nodes[1]
        await sim._req("POST", "/vms", json={"vmid": vmid, "node": nodes[1], "running": True, "config": cfg})
        assert [v["node"] for v in (await sim.state())["vms"] if v["vmid"] == vmid] == [nodes[1]]

        ctx = SimpleNamespace(pve=pve, pool=pool, settings=settings, claimed_at=time.monotonic(),
                              job=SimpleNamespace(id="job_break13b", region=REGION, kind="ServerCreate"))
        world = await vms.observe_member(ctx, spec)
        assert world.vm is not None and (world.vm.vmid, world.vm.node) == (vmid, nodes[1]), world
        assert vms.plan_member(spec, world, region=REGION) == []  # nothing to clone
    finally:
        pve.close()
