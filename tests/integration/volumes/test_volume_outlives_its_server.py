"""A volume's disk is never destroyed with a server's VM, whatever shape it is in there: attached (its
serial on the drive), unplugged by an operator in Proxmox (``PUT …/config delete=scsi1``: a bare
``unused0`` without the serial, qemu-server vmconfig_register_unused_drive), or left there by a detach of
its own that failed part-way. qemu-server's ``destroy_vm`` frees every disk the VM owns, and a disk
reassigned to a server's VM is owned by it (pve-storage ``rename_volume``): z9 finds the volume's disk by
its serial and by the volid it recorded for it, its detach takes it back to the anchor, and while it
cannot, the server's final delete waits (``retry``, naming the volume) instead of destroying it.
Against real PostgreSQL and the simulator over HTTPS; assertions on the world (the simulator's VMs and
storage) and the rows."""
from __future__ import annotations

from z9.common.clock import TestClock
from z9.executor.proxmox import ProxmoxClient
from z9.resources.volume.pve import ProxmoxDisks

from tests.support import REGION, SimAdmin, Stack, wait_until


async def _volume(stack: Stack, vid: str) -> dict:
    status, out = await stack.call("GET", f"/volumes/{vid}")
    assert status == 200, out
    return out["volume"]


async def _jobs(stack: Stack, rid: str) -> list[dict]:
    status, out = await stack.call("GET", f"/jobs?resource_id={rid}")
    assert status == 200, out
    return out["jobs"]


async def _settled(stack: Stack, rid: str, timeout_s: float = 90) -> list[dict]:
    async def done() -> list[dict] | None:
        jobs = await _jobs(stack, rid)
        return jobs if jobs and all(j["status"] in ("succeeded", "failed") for j in jobs) else None
    return await wait_until(done, timeout_s, f"the jobs of {rid}")


async def _attached(stack: Stack, name: str) -> tuple[dict, dict]:
    """A running server with a 2 GiB volume attached: (server, volume)."""
    server, job = await stack.create_server(name)
    assert (await stack.wait_job(job["id"], timeout_s=90))["status"] == "succeeded"
    status, out = await stack.call("POST", "/volumes", json={"name": f"{name}-data", "region": REGION,
                                                              "size_gib": 2, "server_id": server["id"]})
    assert status == 202, out
    vid = out["volume"]["id"]
    assert all(j["status"] == "succeeded" for j in await _settled(stack, vid))
    v = await _volume(stack, vid)
    assert v["status"] == "attached", v
    return await stack.server(server["id"]), v


async def _unplug_by_hand(stack: Stack, server: dict, volume: dict) -> str:
    """What an operator does in Proxmox: ``PUT /nodes/{n}/qemu/{vmid}/config delete=scsiN`` — the drive
    becomes a bare ``unusedN: <volid>``, without the serial. Returns that key."""
    obs = volume["observed"]
    pve = ProxmoxClient(REGION, stack.settings.regions[REGION])
    try:
        await pve.configure_now(obs["node"], obs["vmid"], {"delete": obs["disk"]}, digest=None)
        st = await pve.vm_state(obs["node"], obs["vmid"], status=False)
    finally:
        pve.close()
    assert st is not None
    unused = [k for k, v in st.config.items() if k.startswith("unused") and str(v) == obs["volid"]]
    assert unused and obs["disk"] not in st.config, st.config
    return unused[0]


async def _disk_is_on(sim: SimAdmin, vmid: int, serial: str) -> bool:
    vm = await sim.vm(vmid)
    return vm is not None and any(f"serial={serial}" in str(v) for v in vm["config"].values())


async def test_a_drive_unplugged_by_hand_is_not_destroyed_with_its_server(stack: Stack, sim: SimAdmin,
                                                                         clock: TestClock) -> None:
    """Failed on the code before: the detach searched the recorded volid only for a failed volume, so
    the server's deletion's VolumeDetach failed ("its disk is on no VM z9 can find"), the destroy guard
    looked for serials only, and the server's VM destroy freed the volume's disk."""
    s, v = await _attached(stack, "hand-unplugged")
    await _unplug_by_hand(stack, s, v)
    status, out = await stack.call("DELETE", f"/servers/{s['id']}")
    assert status == 202, out
    jobs = await _settled(stack, v["id"])
    assert jobs[-1]["kind"] == "VolumeDetach" and jobs[-1]["status"] == "succeeded", jobs[-1]
    clock.step(stack.settings.deletion_buffer_s)  # the reaper's final ServerDelete
    await wait_until(lambda: _server_status_is(stack, s["id"], "deleted"), 120, "the server deleted")
    after = await _volume(stack, v["id"])
    assert after["status"] == "available" and after["server_id"] is None, after
    anchor = after["observed"]["anchor"]
    assert after["observed"]["vmid"] == anchor["vmid"]
    assert await _disk_is_on(sim, anchor["vmid"], after["observed"]["serial"])
    assert await sim.vm(s["observed"]["vmid"]) is None  # the server's VM is gone, the disk is not


async def _server_status_is(stack: Stack, sid: str, status: str) -> bool:
    return (await stack.server(sid))["status"] == status


async def test_a_detach_that_failed_part_way_holds_the_servers_destroy(stack: Stack, sim: SimAdmin,
                                                                      clock: TestClock) -> None:
    """The volume's own detach unplugs the drive (a bare ``unused0``) and then fails (the reassign
    refused): the server's delete must not destroy the VM holding that disk — its final job waits in
    ``retry`` naming the volume — and a detach asked again takes the disk to the anchor, after which
    the server's delete ends. Failed on the code before: the guard read serials only, the VM was
    destroyed with the disk."""
    s, v = await _attached(stack, "detach-cut")
    sim.allow_rejections = True  # the injected fault answers 400
    await sim.fault(method="POST", path=r"/move_disk$", action="error", status=400, reason="simulated refusal",
                    times=1)
    status, out = await stack.call("POST", f"/volumes/{v['id']}/actions/detach")
    assert status == 202, out
    assert (await stack.wait_job(out["job"]["id"], timeout_s=90))["status"] == "failed"
    cfg = (await sim.vm(s["observed"]["vmid"]))["config"]
    assert [k for k, val in cfg.items() if k.startswith("unused") and str(val) == v["observed"]["volid"]], cfg

    # the detach fails again when the server's deletion asks for it: the disk stays on the server's VM
    refusing = await sim.fault(method="POST", path=r"/move_disk$", action="error", status=400,
                               reason="simulated refusal", times=100)
    status, out = await stack.call("DELETE", f"/servers/{s['id']}")
    assert status == 202, out
    await _settled(stack, v["id"])
    clock.step(stack.settings.deletion_buffer_s)  # the reaper's final ServerDelete

    async def held() -> dict | None:
        jobs = [j for j in await _jobs(stack, s["id"]) if j["kind"] == "ServerDelete"]
        j = jobs[-1] if jobs else None
        return j if j is not None and j["status"] == "retry" and j.get("error") else None
    job = await wait_until(held, 120, "the server's final delete held")
    assert v["id"] in job["error"]["message"], job
    assert (await stack.server(s["id"]))["status"] != "failed"
    assert await sim.vm(s["observed"]["vmid"]) is not None  # not destroyed, the disk with it

    await sim.delete_fault(refusing)  # the refusals end
    status, out = await stack.call("POST", f"/volumes/{v['id']}/actions/detach")
    assert status == 202, out
    assert (await stack.wait_job(out["job"]["id"], timeout_s=90))["status"] == "succeeded"
    clock.step(60)  # the held delete's next try
    await wait_until(lambda: _server_status_is(stack, s["id"], "deleted"), 120, "the server deleted")
    after = await _volume(stack, v["id"])
    assert after["status"] == "available", after
    assert await _disk_is_on(sim, after["observed"]["anchor"]["vmid"], after["observed"]["serial"])


async def test_a_disk_left_only_on_the_storage_holds_the_servers_destroy(stack: Stack, sim: SimAdmin,
                                                                        clock: TestClock) -> None:
    """The volume's drive taken out of the server VM's config file by hand (not through the API: the image
    stays on the storage, owned by the VM's vmid, named in no config). z9's destroy sends
    ``destroy-unreferenced-disks=1`` (qemu-server destroy_vm ``$purge_unreferenced``: every image of the
    vmid on every storage), so the guard lists the VM's images on the storage of each volid it recorded:
    the server's final delete waits, naming the volume, and the image is kept."""
    s, v = await _attached(stack, "storage-only")
    obs = v["observed"]
    vm = await sim.vm(obs["vmid"])
    cfg = {k: val for k, val in vm["config"].items() if k != obs["disk"]}
    await sim._req("POST", "/vms", json={"vmid": vm["vmid"], "node": vm["node"], "running": vm["running"],
                                         "config": cfg})
    status, out = await stack.call("DELETE", f"/servers/{s['id']}")
    assert status == 202, out
    await _settled(stack, v["id"])  # its detach cannot find the disk in any config: it fails
    clock.step(stack.settings.deletion_buffer_s)

    async def held() -> dict | None:
        jobs = [j for j in await _jobs(stack, s["id"]) if j["kind"] == "ServerDelete"]
        j = jobs[-1] if jobs else None
        return j if j is not None and j["status"] == "retry" and j.get("error") else None
    job = await wait_until(held, 120, "the server's final delete held")
    assert v["id"] in job["error"]["message"] and obs["volid"] in job["error"]["message"], job
    assert await sim.vm(obs["vmid"]) is not None
    pve = ProxmoxClient(REGION, stack.settings.regions[REGION])
    try:
        listed = await ProxmoxDisks(pve).images(obs["node"], obs["volid"].split(":", 1)[0], obs["vmid"])
    finally:
        pve.close()
    assert obs["volid"] in {r["volid"] for r in listed}  # the volume's data is still there
