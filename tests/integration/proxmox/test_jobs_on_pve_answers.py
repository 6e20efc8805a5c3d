"""z9's jobs on what real Proxmox VE answers where it is racy or refuses (the simulator models each
answer after qemu-server's source): a clone race lost after its UPID, a config write refused because
another task locked the VM, a reboot of a VM that stopped meanwhile. Each ends as the README's
operator section says: no false failure, no attempt spent on waiting, no second VM."""
from __future__ import annotations

import asyncio

from z9.common import store
from z9.common.tags import normalize_tags

from tests.support import REGION, SimAdmin, Stack, wait_until


async def test_a_clone_race_lost_after_its_upid_is_no_failure_and_no_second_vm(stack: Stack, sim: SimAdmin) -> None:
    """qemu-server API2/Qemu.pm clone_vm checks the newid before fork_worker without a lock: the
    create's clone gets a UPID and its task fails because a parallel clone (another client's) took
    the vmid. The create picks another vmid in the same attempt and never adopts the winner's VM."""
    await sim.configure(clone_race=1)
    server, job = await stack.create_server("raced")
    done = await stack.wait_job(job["id"], timeout_s=90)
    assert done["status"] == "succeeded" and done["attempt"] == 1, done
    ours = await sim.vms_tagged(f"z9-id-{server['id']}")
    assert len(ours) == 1
    winner = [v for v in (await sim.state())["vms"] if v["config"].get("name", "").startswith("race-winner-")]
    assert len(winner) == 1 and winner[0]["vmid"] != ours[0]["vmid"]
    assert not any(t.startswith("z9-id-") for t in normalize_tags(winner[0]["config"].get("tags")))
    assert (await sim.counters())["tasks_started"]["qmclone"] == 3  # ours lost, the winner's, ours again


async def test_a_config_write_refused_as_locked_spends_no_attempt(stack: Stack, sim: SimAdmin) -> None:
    """A config write to a VM another task locked answers at once 500 "VM is locked (clone)"
    (Qemu.pm $update_vm_api checks the lock before the flock): the create waits on the world
    (a snooze) and goes on; its attempt is not spent."""
    await sim.fault(method="PUT", path=r"/qemu/\d+/config$", action="error", status=500,
                    reason="VM is locked (clone)", times=1)
    server, job = await stack.create_server("locked")
    done = await stack.wait_job(job["id"], timeout_s=90)
    assert done["status"] == "succeeded" and done["attempt"] == 1, done
    assert len(await sim.vms_tagged(f"z9-id-{server['id']}")) == 1


async def test_a_reboot_of_a_vm_stopped_meanwhile_starts_it(stack: Stack, sim: SimAdmin) -> None:
    """Qemu.pm vm_reboot refuses a stopped VM before any task (500 "VM n not running"): a reboot
    whose VM stopped between the job's read and its request starts the VM instead (the README: a
    reboot of a stopped server starts it), in the same attempt."""
    server, job = await stack.create_server("rebooted")
    assert (await stack.wait_job(job["id"], timeout_s=90))["status"] == "succeeded"
    vmid = (await stack.server(server["id"]))["observed"]["vmid"]
    await asyncio.sleep(1.1)  # uptime has a resolution of one second (as in test_server_actions)
    fid = await sim.fault(method="POST", path=rf"/qemu/{vmid}/status/reboot$", action="delay", seconds=1.5)
    status, out = await stack.call("POST", f"/servers/{server['id']}/actions/reboot")
    assert status == 202, out

    async def delayed() -> bool:
        return not any(f["id"] == fid for f in await sim._req("GET", "/faults"))
    await wait_until(delayed, 30, "the reboot request reached the simulator")
    vm = await sim.vm(vmid)
    await sim._req("POST", "/vms", json={"vmid": vmid, "node": vm["node"], "running": False, "config": vm["config"]})
    done = await stack.wait_job(out["job"]["id"], timeout_s=60)
    assert done["status"] == "succeeded" and done["attempt"] == 1, done
    assert (await sim.vm(vmid))["running"]
    assert (await sim.counters())["tasks_started"].get("qmreboot", 0) == 0


async def test_a_server_create_reads_each_vm_once_per_phase(stack: Stack, sim: SimAdmin) -> None:
    """A server create reads each VM once per phase that needs it (it made 26 requests: config and
    status read six times each; 21 with the guest look in verify): the template's config once, the
    clone's config once after its task, no power state before the start (the clone is stopped, and
    the start task refuses what a read would have shown), config and power state once in verify;
    the config written at once (PUT: no task to poll); ``/cluster/nextid`` at most once per 30 s of a
    process — 8 requests besides the polls of its three tasks. Verify's look into the guest
    (cloud-init ended without error, its instance-id the drive's, its hostname the server's) is
    one command (agent/exec and its exec-status) and the drive's meta-data; the drive's pending
    state only when the instance-ids differ. How often a task or the guest command is polled
    depends on how long it takes (the first poll waits about as long as that took lately): that
    figure is bench/scale.py's ``pve_requests_per_job``, not this test's."""
    first, job = await stack.create_server("warm")  # the executor learns how long each task type takes
    assert (await stack.wait_job(job["id"], timeout_s=90))["status"] == "succeeded"
    await sim._req("POST", "/stats/refresh")

    async def counts() -> dict[tuple[str, str], int]:  # per (method, path), whatever the status answered
        out: dict[tuple[str, str], int] = {}
        for r in (await sim.counters())["requests"]:
            out[(r["method"], r["path"])] = out.get((r["method"], r["path"]), 0) + r["count"]
        return out
    before = await counts()
    server, job = await stack.create_server("counted")
    done = await stack.wait_job(job["id"], timeout_s=90)
    assert done["status"] == "succeeded", done
    after = await counts()
    used = {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}
    print("requests of one server create:", sum(used.values()), dict(sorted(used.items())))
    vm = "/nodes/{node}/qemu/{vmid}"
    polls = {k: n for k, n in used.items() if k[1] in ("/nodes/{node}/tasks/{upid}/status", vm + "/agent/exec-status")}
    guest = {k: n for k, n in used.items() if k not in polls and ("/agent/" in k[1] or "/cloudinit" in k[1])}
    vm_work = {k: n for k, n in used.items() if k not in polls and k not in guest and k[1] != "/cluster/resources"}
    assert used.get(("GET", vm + "/config"), 0) <= 3 and used.get(("GET", vm + "/status/current"), 0) <= 1, used
    assert used.get(("PUT", vm + "/config")) == 1 and ("POST", vm + "/config") not in used, used
    # 8, and the VM firewall's 5: its options and rules read before the one write of its policies
    # (its NIC's firewall=1 goes with the configure step's write), and read again by verify
    assert used.get(("PUT", vm + "/firewall/options")) == 1, used
    assert used.get(("GET", vm + "/firewall/options"), 0) <= 2 and used.get(("GET", vm + "/firewall/rules"), 0) <= 2
    assert sum(vm_work.values()) - used.get(("GET", "/cluster/nextid"), 0) <= 13, vm_work
    assert used.get(("GET", "/nodes/{node}/tasks/{upid}/status"), 0) >= 3, used  # each task waited on
    # one look (a "not running" answer of an agent still booting aside) and the drive's meta-data
    assert guest.get(("GET", vm + "/cloudinit/dump")) == 1 and set(guest) == {
        ("POST", vm + "/agent/exec"), ("GET", vm + "/cloudinit/dump")}, guest


async def test_a_resize_that_became_pending_says_so(stack: Stack, sim: SimAdmin) -> None:
    """The VM starts between the resize's read and its config write: PVE keeps cores/memory in
    [PENDING] (QemuServer.pm vmconfig_hotplug_pending) and GET config lays them over. The job does
    not record a resize the running guest does not have: it fails server_not_stopped, naming what
    waits for the next boot."""
    server, job = await stack.create_server("pending")
    assert (await stack.wait_job(job["id"], timeout_s=90))["status"] == "succeeded"
    sid = server["id"]
    status, out = await stack.call("POST", f"/servers/{sid}/actions/poweroff")
    assert status == 202 and (await stack.wait_job(out["job"]["id"], timeout_s=60))["status"] == "succeeded"
    vmid = (await stack.server(sid))["observed"]["vmid"]
    fid = await sim.fault(method="POST", path=rf"/qemu/{vmid}/config$", action="delay", seconds=1.5)
    status, out = await stack.call("POST", f"/servers/{sid}/actions/resize",
                                   json={"cores": 4, "memory_mib": 4096, "disk_gib": 10})
    assert status == 202, out

    async def delayed() -> bool:
        return not any(f["id"] == fid for f in await sim._req("GET", "/faults"))
    await wait_until(delayed, 30, "the config write reached the simulator")
    vm = await sim.vm(vmid)
    await sim._req("POST", "/vms", json={"vmid": vmid, "node": vm["node"], "running": True, "config": vm["config"]})
    done = await stack.wait_job(out["job"]["id"], timeout_s=60)
    assert done["status"] == "failed", done
    assert "server_not_stopped" in done["error"]["message"] and "pending" in done["error"]["message"], done
    assert (await sim.vm(vmid))["pending"]["cores"] == "4"


async def _lb_ha(stack: Stack, sim: SimAdmin, name: str) -> list[dict]:
    from tests.support import REGION
    status, out = await stack.call("POST", "/load-balancers", json={"region": REGION, "name": name, "type": "lb-ha"})
    assert status == 202, out
    done = await stack.wait_job(out["job"]["id"], timeout_s=180)
    assert done["status"] == "succeeded", done
    return await sim.vms_tagged(f"z9-id-{out['load_balancer']['id']}")


async def test_lb_ha_from_a_template_on_local_storage_is_cloned_then_migrated(stack: Stack, sim: SimAdmin) -> None:
    """The region's appliance template is on local-lvm only: PVE refuses the cross-node clone
    ("VM uses local storage", no task), so the second member is cloned on the template's node and
    migrated offline before its first start (README: what an operator provides)."""
    from tests.integration.load_balancers.test_load_balancers import LB_TEMPLATE
    await sim._req("POST", "/vms", json=LB_TEMPLATE)
    apps = await _lb_ha(stack, sim, "local-tpl")
    assert len({v["node"] for v in apps}) == 2
    counters = await sim.counters()
    assert counters["tasks_started"].get("qmigrate", 0) == 1 and counters["tasks_started"]["qmclone"] == 2
    refused = [r for r in counters["requests"] if r["path"] == "/nodes/{node}/qemu/{vmid}/clone" and r["status"] == 500]
    assert sum(r["count"] for r in refused) == 1  # once per template and executor process


async def test_lb_ha_with_one_template_per_node_clones_on_each_node(stack: Stack, sim: SimAdmin) -> None:
    """A template of the image's name on each node: each member is cloned from the one on its own
    node — no cross-node clone, no migration."""
    from tests.integration.load_balancers.test_load_balancers import LB_TEMPLATE
    await sim._req("POST", "/vms", json=LB_TEMPLATE)
    second = {**LB_TEMPLATE, "vmid": 9101, "node": "pve2",
              "config": {**LB_TEMPLATE["config"], "scsi0": "local-lvm:base-9101-disk-0,size=2G",
                         "ide2": "local-lvm:vm-9101-cloudinit,media=cdrom"}}
    await sim._req("POST", "/vms", json=second)
    await sim._req("POST", "/stats/refresh")
    apps = await _lb_ha(stack, sim, "per-node-tpl")
    assert sorted(v["node"] for v in apps) == ["pve1", "pve2"]
    counters = await sim.counters()
    assert counters["tasks_started"].get("qmigrate", 0) == 0
    assert not [r for r in counters["requests"] if r["path"] == "/nodes/{node}/qemu/{vmid}/clone" and r["status"] >= 400]


async def test_lb_ha_from_a_template_on_shared_storage_is_cloned_to_each_node(stack: Stack, sim: SimAdmin) -> None:
    """The region's appliance template is on the shared images storage (the simulator's ``ceph-vm``,
    an rbd pool: pve-storage Plugin.pm marks @SHARED_STORAGE types ``shared``): PVE accepts the
    cross-node clone (qemu-server API2/Qemu.pm clone_vm, $check_storage_access_clone), so each
    member is cloned straight onto its node with ``target=`` — no refusal, no migration."""
    from tests.integration.load_balancers.test_load_balancers import LB_TEMPLATE
    shared = {**LB_TEMPLATE, "config": {**LB_TEMPLATE["config"], "scsi0": "ceph-vm:base-9100-disk-0,size=2G",
                                        "ide2": "ceph-vm:vm-9100-cloudinit,media=cdrom"}}
    await sim._req("POST", "/vms", json=shared)
    await sim._req("POST", "/stats/refresh")
    status, out = await stack.call("POST", "/load-balancers", json={"region": REGION, "name": "shared-tpl",
                                                                    "type": "lb-ha"})
    assert status == 202, out
    done = await stack.wait_job(out["job"]["id"], timeout_s=180)
    assert done["status"] == "succeeded", done
    apps = await sim.vms_tagged(f"z9-id-{out['load_balancer']['id']}")
    assert len({v["node"] for v in apps}) == 2
    assert all(v["config"]["scsi0"].startswith("ceph-vm:") for v in apps)
    counters = await sim.counters()
    assert counters["tasks_started"].get("qmigrate", 0) == 0 and counters["tasks_started"]["qmclone"] == 2
    assert not [r for r in counters["requests"] if r["path"] == "/nodes/{node}/qemu/{vmid}/clone" and r["status"] >= 400]
    assert not [r for r in counters["requests"] if r["path"] == "/nodes/{node}/qemu/{vmid}/migrate"]
    # the plan had no migrate step, and each clone step named its member's own node (the target)
    job = await store.job_get(stack.pool, out["job"]["id"])
    assert not [s for s in job.steps if s["name"] == "migrate"], job.steps
    on = {v["config"]["name"].rsplit("-", 1)[-1]: v["node"] for v in apps}
    clones = {s["detail"]["member"]: s["detail"]["node"] for s in job.steps if s["name"] == "clone"}
    assert clones == {f"lb-{k}": n for k, n in on.items()}, (clones, on)
