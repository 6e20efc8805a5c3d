"""A volume's reconciler (z9.resources.volume.jobs.reconcile, z9.resources.volume.disks): the pure plan on hand-built worlds, the
disk finder and the deletion guard, and the steps against the simulator over HTTPS — create, attach to a
running server (the guest sees the disk by its serial), grow online, detach, attach elsewhere, delete —
including a job cut short after any step and resumed from what exists."""
from __future__ import annotations

import json
import time
from typing import Any, Iterator

import pytest

from z9.common.errors import GuardRefusal, PermanentError, Snooze
from z9.common.settings import RegionSettings
from z9.common.tags import customer_vm_tags, format_tags, identity_tag
from z9.executor.context import Step
from z9.resources.volume.disks import find_volume_disk, free_drive_key, parse_disks, volume_serial
from z9.resources.volume.guard import guard_disks
from z9.executor.proxmox import ProxmoxClient, VmState
from z9.resources.volume.pve import ProxmoxDisks
from z9.resources.volume.jobs.reconcile import Placed, StepEnv, VolumeIntent, VolumeWorld, apply_step, observe, plan

from tests.support import wait_until, SimAdmin

VOL = "vol_01jd0000000000000000000abc"
VOL2 = "vol_01jd0000000000000000000xyz"
SRV_A = "srv_01jd00000000000000000000aa"
SRV_B = "srv_01jd00000000000000000000bb"
SERIAL = volume_serial(VOL)


def vm(vmid: int, config: dict[str, Any], *, running: bool = False, node: str = "pve1", owner: str = VOL,
       member: str = "volume") -> VmState:
    tags = customer_vm_tags(owner, member)
    return VmState(vmid=vmid, node=node, config={"tags": format_tags(tags), "digest": "d", **config},
                   status="running" if running else "stopped", tags=tags)


def names(steps: list[Step]) -> list[str]:
    return [s.name for s in steps]


# ---------------------------------------------------------------- identity, finder, guard (pure)

def test_serial_is_20_bytes_and_unique_per_volume() -> None:
    assert len(SERIAL) == 20 and SERIAL.startswith("z9") and SERIAL != volume_serial(VOL2)


def test_the_disk_is_found_by_serial_or_a_recorded_volid_never_by_key() -> None:
    cfg = {"scsi0": "ceph-vm:vm-101-disk-0,size=20G", "scsi1": f"ceph-vm:vm-101-disk-1,serial={VOL2[-18:]},size=1G",
           "scsi5": f"ceph-vm:vm-101-disk-2,serial={SERIAL},size=10G", "ide2": "ceph-vm:vm-101-cloudinit,media=cdrom",
           "unused0": "ceph-vm:vm-101-disk-3"}
    d = find_volume_disk(cfg, SERIAL)
    assert d is not None and (d.key, d.size_gib) == ("scsi5", 10.0)
    assert find_volume_disk({"unused0": "ceph-vm:vm-101-disk-3"}, SERIAL) is None
    d = find_volume_disk({"unused0": "ceph-vm:vm-101-disk-3"}, SERIAL, ["ceph-vm:vm-101-disk-3"])
    assert d is not None and d.unused
    assert [x.key for x in parse_disks(cfg)] == ["scsi0", "scsi1", "scsi5", "unused0"]  # no CD-ROM
    assert free_drive_key(cfg) == "scsi2" and free_drive_key(cfg, {"scsi2": "x"}) == "scsi3"


def test_guard_refuses_a_disk_of_no_volume_of_the_job() -> None:
    cfg = {"scsi0": "ceph-vm:vm-101-disk-0,size=20G", "scsi1": f"ceph-vm:vm-101-disk-1,serial={SERIAL},size=1G"}
    with pytest.raises(GuardRefusal, match="volume disk"):
        guard_disks(101, "pve1", cfg, allowed_serials=set(), own_keys=("scsi0",))  # a server delete
    guard_disks(101, "pve1", cfg, allowed_serials={SERIAL}, own_keys=("scsi0",))  # with delete_volumes
    with pytest.raises(GuardRefusal, match="belongs to no volume"):  # an anchor holding a foreign disk
        guard_disks(300, "pve1", {"scsi0": f"ceph-vm:vm-300-disk-0,serial={SERIAL}", "scsi1": "ceph-vm:vm-300-disk-1"},
                    allowed_serials={SERIAL}, allowed_volids=set())


# ---------------------------------------------------------------- plan (pure, hand-built worlds)

INTENT = VolumeIntent(VOL, "data", 10, "ceph-vm")
ANCHOR = vm(300, {"scsi0": f"ceph-vm:vm-300-disk-0,serial={SERIAL},size=10G"})
EMPTY_ANCHOR = vm(300, {})
SERVER_A = vm(101, {"scsi0": "local-lvm:vm-101-disk-0,size=20G"}, running=True, owner=SRV_A, member="main")
SERVER_B = vm(102, {"scsi0": "local-lvm:vm-102-disk-0,size=20G"}, running=True, owner=SRV_B, member="main",
              node="pve2")
DISK = find_volume_disk(ANCHOR.config, SERIAL)
ON_A = find_volume_disk({"scsi1": f"ceph-vm:vm-101-disk-1,serial={SERIAL},size=10G"}, SERIAL)


def test_plan_create_then_attach_and_nothing_when_converged() -> None:
    assert names(plan(INTENT, VolumeWorld())) == ["create"]
    w = VolumeWorld(target=SERVER_A)
    assert names(plan(VolumeIntent(VOL, "data", 10, "ceph-vm", server_id=SRV_A), w)) == ["create", "attach"]
    assert plan(INTENT, VolumeWorld(anchor=ANCHOR, placed=Placed(ANCHOR, DISK, None))) == []
    assert ON_A is not None and DISK is not None
    w = VolumeWorld(anchor=EMPTY_ANCHOR, placed=Placed(SERVER_A, ON_A, SRV_A), target=SERVER_A)
    assert plan(VolumeIntent(VOL, "data", 10, "ceph-vm", server_id=SRV_A), w) == []


def test_plan_never_makes_again_a_disk_that_once_existed() -> None:
    # found nowhere, a volume that never had a disk is created; one whose disk a verify once saw is lost
    assert names(plan(VolumeIntent(VOL, "data", 10, "ceph-vm"), VolumeWorld())) == ["create"]
    with pytest.raises(PermanentError, match="on no VM z9 can find"):
        plan(VolumeIntent(VOL, "data", 20, "ceph-vm", had_disk=True), VolumeWorld())
    with pytest.raises(PermanentError, match="on no VM z9 can find"):
        plan(VolumeIntent(VOL, "data", 10, "ceph-vm", server_id=SRV_A, had_disk=True), VolumeWorld(target=SERVER_A))
    assert plan(VolumeIntent(VOL, "data", 10, "ceph-vm", delete=True, had_disk=True), VolumeWorld()) == []


def test_a_server_whose_vm_is_not_there_yet_is_waited_for_without_spending_an_attempt() -> None:
    """Waiting on the world spends no attempt: a volume meant for a server whose VM does not exist
    yet (its create still cloning) snoozes, the reason named, instead of failing the attempt (one
    resize took 8 of 10 attempts so)."""
    w = VolumeWorld(anchor=ANCHOR, placed=Placed(ANCHOR, DISK, None))
    with pytest.raises(Snooze, match=f"the VM of server {SRV_A} is not there yet"):
        plan(VolumeIntent(VOL, "data", 10, "ceph-vm", server_id=SRV_A), w)


def test_plan_moves_between_servers_through_the_anchor() -> None:
    assert ON_A is not None
    w = VolumeWorld(anchor=EMPTY_ANCHOR, placed=Placed(SERVER_A, ON_A, SRV_A), target=SERVER_B)
    steps = plan(VolumeIntent(VOL, "data", 10, "ceph-vm", server_id=SRV_B), w)
    assert names(steps) == ["unplug", "detach", "label", "move_anchor", "attach"]
    stopped = vm(101, SERVER_A.config, running=False, owner=SRV_A, member="main")
    w = VolumeWorld(anchor=EMPTY_ANCHOR, placed=Placed(stopped, ON_A, SRV_A))
    assert names(plan(INTENT, w)) == ["detach", "label"]  # a stopped VM's drive is reassigned as it is


def test_plan_grows_where_the_disk_is_and_never_shrinks() -> None:
    assert DISK is not None
    w = VolumeWorld(anchor=ANCHOR, placed=Placed(ANCHOR, DISK, None))
    assert names(plan(VolumeIntent(VOL, "data", 20, "ceph-vm"), w)) == ["resize"]
    with pytest.raises(PermanentError, match="never shrink"):
        plan(VolumeIntent(VOL, "data", 5, "ceph-vm"), w)


def test_plan_resumes_a_detach_cut_short_and_a_create_in_flight() -> None:
    bare = find_volume_disk({"unused0": "ceph-vm:vm-101-disk-1"}, SERIAL, ["ceph-vm:vm-101-disk-1"])
    assert bare is not None
    w = VolumeWorld(anchor=EMPTY_ANCHOR, placed=Placed(SERVER_A, bare, SRV_A))
    assert names(plan(INTENT, w)) == ["detach", "label"]  # no second unplug
    unlabelled = find_volume_disk({"scsi0": "ceph-vm:vm-300-disk-0,size=10G"}, SERIAL, ["ceph-vm:vm-300-disk-0"])
    assert unlabelled is not None
    assert names(plan(INTENT, VolumeWorld(anchor=EMPTY_ANCHOR, placed=Placed(EMPTY_ANCHOR, unlabelled, None)))) == [
        "label"]
    with pytest.raises(Snooze):
        plan(INTENT, VolumeWorld(creating=vm(300, {"lock": "create"})))


def test_plan_delete_detaches_first_and_guards_the_anchor() -> None:
    assert ON_A is not None and DISK is not None
    gone = VolumeIntent(VOL, "data", 10, "ceph-vm", delete=True)
    w = VolumeWorld(anchor=EMPTY_ANCHOR, placed=Placed(SERVER_A, ON_A, SRV_A))
    assert names(plan(gone, w)) == ["unplug", "detach", "label", "destroy"]
    assert names(plan(gone, VolumeWorld(anchor=ANCHOR, placed=Placed(ANCHOR, DISK, None)))) == ["destroy"]
    assert plan(gone, VolumeWorld()) == []
    foreign = vm(300, {"scsi0": ANCHOR.config["scsi0"], "scsi1": "ceph-vm:vm-300-disk-1,size=1G"})
    with pytest.raises(GuardRefusal):
        plan(gone, VolumeWorld(anchor=foreign, placed=Placed(foreign, DISK, None)))
    not_ours = vm(300, ANCHOR.config, owner=VOL2)
    with pytest.raises(GuardRefusal):
        plan(gone, VolumeWorld(anchor=not_ours, placed=Placed(not_ours, DISK, None)))


# ---------------------------------------------------------------- the steps against the simulator

_OPEN: list[ProxmoxClient] = []


@pytest.fixture(autouse=True)
def _close_clients() -> Iterator[None]:
    yield
    while _OPEN:
        _OPEN.pop().close()


def _client(sim: SimAdmin) -> ProxmoxClient:
    srv = sim.server
    c = ProxmoxClient("dev-1", RegionSettings(url=srv.url, token_id=srv.token_id, token_secret=srv.token_secret,
                                              verify_ssl=str(srv.cert_path), request_timeout_s=10))
    _OPEN.append(c)
    return c


class Harness:
    """observe → plan → apply each step, as a job's attempt does; ``stop_after`` cuts it short."""

    def __init__(self, pve: ProxmoxClient):
        self.pve = pve
        self.ops = ProxmoxDisks(pve)
        self.known: list[str] = []
        self.last_steps: list[dict[str, Any]] = []

    async def find(self, owner: str) -> VmState | None:
        for ref in await self.pve.find_by_tag(identity_tag(owner), not_before=time.monotonic()):
            st = await self.pve.vm_state(ref.node, ref.vmid)
            if st is not None and identity_tag(owner) in st.tags:
                return st
        return None

    async def world(self, intent: VolumeIntent) -> VolumeWorld:
        return await observe(self.ops, intent, find_anchor=self.find, find_server=self.find,
                             known_servers=self.known, last_steps=self.last_steps)

    async def run(self, intent: VolumeIntent, stop_after: str | None = None) -> list[str]:
        steps = plan(intent, await self.world(intent))
        self.last_steps = [s.as_json() for s in steps]

        async def record(step: Step, **detail: Any) -> None:
            step.detail.update(detail)
            self.last_steps = [s.as_json() for s in steps]

        async def wait_task(step: Step, upid: str) -> str:
            await record(step, upid=upid)
            return await self.pve.wait_task(upid, deadline_s=30, poll_s=0.05)

        async def fence() -> None:
            return None

        env = StepEnv(self.ops, lambda: self.world(intent), wait_task, fence, record, self.pve.nodes)
        for s in steps:
            await apply_step(env, intent, s)
            if s.name == stop_after:
                return names(steps)
        if intent.server_id:
            self.known = [intent.server_id]
        assert plan(intent, await self.world(intent)) == [], "verify: the plan must be empty"
        return names(steps)


async def _server(sim: SimAdmin, pve: ProxmoxClient, owner: str, vmid: int, node: str = "pve1") -> VmState:
    """A running customer VM of ``owner`` (a clone of the dev template, tagged), its guest up."""
    await pve.wait_task(await pve.clone("pve1", 9000, newid=vmid, name=f"s{vmid}", description="t"),
                        deadline_s=30, poll_s=0.05)
    await pve.wait_task(await pve.configure("pve1", vmid, {"tags": format_tags(customer_vm_tags(owner))},
                                            digest=None), deadline_s=30, poll_s=0.05)
    if node != "pve1":
        await pve.wait_task(await pve.migrate("pve1", vmid, node), deadline_s=30, poll_s=0.05)
    await pve.wait_task(await pve.start(node, vmid), deadline_s=30, poll_s=0.05)
    async def agent_answers() -> bool:
        try:
            await pve.agent_ping(node, vmid)
            return True
        except Exception:
            return False
    await wait_until(agent_answers, 30, "the guest agent to answer")
    st = await pve.vm_state(node, vmid)
    assert st is not None
    return st


async def _guest_disks(pve: ProxmoxClient, node: str, vmid: int) -> dict[str, int]:
    code, out, err = await pve.agent_exec(node, vmid, ["lsblk", "-J", "-b", "-d", "-o", "NAME,SIZE,SERIAL,TYPE"],
                                          poll_s=0.05)
    assert code == 0, err
    return {d["serial"]: d["size"] for d in json.loads(out)["blockdevices"] if d["type"] == "disk"}


async def _images(pve: ProxmoxClient) -> list[dict[str, Any]]:
    return await ProxmoxDisks(pve).images("pve1", "ceph-vm")


async def test_create_attach_grow_detach_attach_elsewhere_delete(sim: SimAdmin) -> None:
    pve = _client(sim)
    h = Harness(pve)
    a = await _server(sim, pve, SRV_A, 201)
    b = await _server(sim, pve, SRV_B, 202, node="pve2")
    assert await h.run(VolumeIntent(VOL, "data", 4, "ceph-vm", server_id=SRV_A)) == ["create", "attach"]
    cfg_a = (await pve.vm_state("pve1", 201)).config  # type: ignore[union-attr]
    d = find_volume_disk(cfg_a, SERIAL)
    assert d is not None and d.key == "scsi1" and d.size_gib == 4
    assert (await _guest_disks(pve, "pve1", 201))[SERIAL] == 4 * 1024**3  # the guest sees it, by serial

    assert await h.run(VolumeIntent(VOL, "data", 6, "ceph-vm", server_id=SRV_A)) == ["resize"]  # online
    assert (await _guest_disks(pve, "pve1", 201))[SERIAL] == 6 * 1024**3

    assert await h.run(VolumeIntent(VOL, "data", 6, "ceph-vm")) == ["unplug", "detach", "label"]
    assert SERIAL not in await _guest_disks(pve, "pve1", 201)
    assert not [k for k in (await pve.vm_state("pve1", 201)).config if k.startswith("unused")]  # type: ignore[union-attr]

    assert await h.run(VolumeIntent(VOL, "data", 6, "ceph-vm", server_id=SRV_B)) == ["move_anchor", "attach"]
    assert (await _guest_disks(pve, "pve2", 202))[SERIAL] == 6 * 1024**3
    assert b.vmid == 202 and a.vmid == 201
    vols = [r for r in await _images(pve) if r["vmid"] == 202]  # the servers boot from local-lvm
    assert len(vols) == 1 and vols[0]["size"] == 6 * 1024**3  # one disk, not a copy

    assert await h.run(VolumeIntent(VOL, "data", 6, "ceph-vm", delete=True)) == ["unplug", "detach", "label", "destroy"]
    assert await h.find(VOL) is None
    assert not [r for r in await _images(pve) if r["size"] == 6 * 1024**3]  # the disk is gone, no orphan


@pytest.mark.parametrize("cut", ["unplug", "detach", "attach", "create"])
async def test_a_job_cut_short_resumes_from_what_exists(sim: SimAdmin, cut: str) -> None:
    pve = _client(sim)
    h = Harness(pve)
    await _server(sim, pve, SRV_A, 203)
    await _server(sim, pve, SRV_B, 204)
    if cut in ("create", "attach"):
        await h.run(VolumeIntent(VOL, "data", 2, "ceph-vm", server_id=SRV_A), stop_after=cut)
        await h.run(VolumeIntent(VOL, "data", 2, "ceph-vm", server_id=SRV_A))
        final = 203
    else:
        await h.run(VolumeIntent(VOL, "data", 2, "ceph-vm", server_id=SRV_A))
        await h.run(VolumeIntent(VOL, "data", 2, "ceph-vm", server_id=SRV_B), stop_after=cut)
        await h.run(VolumeIntent(VOL, "data", 2, "ceph-vm", server_id=SRV_B))
        final = 204
    holders = []
    for vmid in (203, 204):
        st = await pve.vm_state("pve1", vmid)
        assert st is not None
        assert not [k for k in st.config if k.startswith("unused")], st.config  # no unused orphan
        if find_volume_disk(st.config, SERIAL):
            holders.append(vmid)
    assert holders == [final]  # attached once, to one VM
    assert SERIAL in await _guest_disks(pve, "pve1", final)


async def test_delete_refuses_an_anchor_holding_another_disk(sim: SimAdmin) -> None:
    pve = _client(sim)
    h = Harness(pve)
    await h.run(VolumeIntent(VOL, "data", 1, "ceph-vm"))
    anchor = await h.find(VOL)
    assert anchor is not None
    await pve.wait_task(await pve.configure(anchor.node, anchor.vmid, {"scsi1": "ceph-vm:1"}, digest=None),
                        deadline_s=30, poll_s=0.05)
    with pytest.raises(GuardRefusal):
        await h.run(VolumeIntent(VOL, "data", 1, "ceph-vm", delete=True))
    assert await h.find(VOL) is not None
