"""Three defects of the VM machinery (issue 8 §1), each reproduced against the simulator:

1. templates are identified by what their config says, not by the lagging name in
   ``/cluster/resources``; a template not visible yet is waited for, never a permanent failure;
2. only a clone this resource's own request started is its own: a VM under ``lock: clone`` at a
   vmid the resource once asked for is someone else's unless its request is still in flight, and
   waiting on the world spends no attempt;
3. a clone request recorded before it is sent is uncertain until its answer is recorded, whoever
   sent it: an executor killed with the request in flight never leads to a second clone.
"""
from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.support import SimAdmin, Stack, wait_until

TEMPLATE = {"template": "1", "cores": "1", "memory": "1024", "scsihw": "virtio-scsi-single",
            "ide2": "local-lvm:vm-{vmid}-cloudinit,media=cdrom", "boot": "order=scsi0",
            "net0": "virtio=BC:24:11:90:01:00,bridge=vmbr0", "tags": "z9-image"}


async def _put_template(sim: SimAdmin, vmid: int, name: str, ostype: str) -> None:
    cfg = {k: v.format(vmid=vmid) for k, v in TEMPLATE.items()}
    cfg.update(name=name, ostype=ostype, scsi0=f"local-lvm:base-{vmid}-disk-0,size=2G")
    await sim._req("POST", "/vms", json={"vmid": vmid, "node": "pve1", "running": False, "config": cfg})


async def _vm_of(sim: SimAdmin, server_id: str) -> dict[str, Any]:
    [vm] = await sim.vms_tagged(f"z9-id-{server_id}")
    return vm



async def _snoozed(stack: Stack, job_id: str) -> dict | None:
    """The job once it has waited on the world at least once (or ended)."""
    j = await stack.job(job_id)
    return j if j["status"] in ("succeeded", "failed") or (j["error"] or {}).get("class") == "snooze" else None


async def test_a_template_renamed_out_of_band_is_known_by_its_config(stack: Stack, sim: SimAdmin) -> None:
    """/cluster/resources still shows 9000 as debian-12 (its stats lag), but 9000 was renamed and
    a new template 9001 is debian-12 now: the clone is made from 9001."""
    await sim._req("POST", "/stats/refresh")
    await sim.configure(stats_lag_s=3600)  # the names in /cluster/resources stay as they are now
    await sim.set_config(9000, name="debian-12-old")
    await _put_template(sim, 9001, "debian-12", ostype="win11")  # tell the two images apart
    server, job = await stack.create_server()
    done = await stack.wait_job(job["id"], timeout_s=60)
    assert done["status"] == "succeeded", done
    assert (await _vm_of(sim, server["id"]))["config"]["ostype"] == "win11"  # cloned from 9001


async def test_a_template_not_visible_yet_is_waited_for(stack: Stack, sim: SimAdmin) -> None:
    """No template of that name yet (an image being imported): the create waits — the server
    stays creating, no attempt is spent — and goes on once the template exists."""
    await sim.set_config(9000, name="debian-11")
    await sim._req("POST", "/stats/refresh")  # the list says debian-11 too
    server, job = await stack.create_server()
    j = await wait_until(lambda: _snoozed(stack, job["id"]), 20, "the create waiting for the template")
    assert j["status"] in ("pending", "retry", "running") and j["attempt"] <= 1, j
    assert j["error"] and j["error"]["class"] == "snooze" and "debian-12" in j["error"]["message"], j
    assert (await stack.server(server["id"]))["status"] == "creating"
    await sim.configure(stats_lag_s=3600)  # a template imported moments ago: no name in the list yet
    await _put_template(sim, 9001, "debian-12", ostype="l26")
    done = await stack.wait_job(job["id"], timeout_s=60)
    assert done["status"] == "succeeded", done


@pytest.mark.settings(deletion_buffer_s=0.1)
async def test_a_locked_clone_at_a_vmid_we_once_asked_for_is_not_ours(stack: Stack, sim: SimAdmin) -> None:
    """Server A's create once asked for vmid 150 and was answered with an error; later another
    server's clone runs at 150 (``lock: clone``, no tags, no marker yet). A's final delete must not
    take it for its own clone: it neither waits on it nor spends attempts, and leaves it alone."""
    server, job = await stack.create_server()
    assert (await stack.wait_job(job["id"], timeout_s=60))["status"] == "succeeded"
    # the record of that earlier, refused request (sent by A's create job)
    await stack.pool.execute(
        "INSERT INTO vm_clone_requests (resource_id, member, vmid, node, job_id, sent_at, answered_at) "
        "VALUES ($1, 'main', 150, 'pve1', $2, now() - interval '1 hour', now() - interval '1 hour')",
        server["id"], job["id"])
    # someone else's clone, still running at 150
    await sim._req("POST", "/vms", json={"vmid": 150, "node": "pve1", "running": False, "config": {
        "name": "other", "lock": "clone", "cores": "1", "memory": "512",
        "scsi0": "local-lvm:vm-150-disk-0,size=2G"}})
    assert (await stack.call("DELETE", f"/servers/{server['id']}"))[0] == 202
    await wait_until(lambda: _status(stack, server["id"], "deleted"), 30, "the server to be deleted")
    _, jobs = await stack.call("GET", f"/jobs?resource_id={server['id']}")
    final = next(j for j in jobs["jobs"] if j["kind"] == "ServerDelete")
    assert final["status"] == "succeeded" and final["attempt"] == 1, final
    other = await sim.vm(150)
    assert other is not None and other["config"].get("lock") == "clone"  # untouched


async def _status(stack: Stack, sid: str, status: str) -> bool:
    return (await stack.server(sid))["status"] == status


@pytest.mark.settings(uncertain_window_s=30.0)
async def test_a_clone_request_whose_sender_died_is_waited_for_not_repeated(stack: Stack, sim: SimAdmin) -> None:
    """A clone request recorded before it was sent, whose sender died before recording the answer
    (SIGKILL, freeze: nothing marks it lost): the next attempt must not clone again while it may
    still be performed — it waits (no attempt spent) and adopts the VM when the request lands.
    Cloning again made the late request's VM an orphan (3 clone tasks for 2 creates)."""
    from z9.executor.vms import marker

    await stack.stop_service("executor")
    server, job = await stack.create_server()
    # what the dead sender left: the request, recorded, never answered
    await stack.pool.execute(
        "INSERT INTO vm_clone_requests (resource_id, member, vmid, node, job_id) VALUES ($1, 'main', 150, 'pve1', $2)",
        server["id"], job["id"])
    await stack.start_service("executor")
    j = await wait_until(lambda: _snoozed(stack, job["id"]), 20, "the create waiting out the unanswered request")
    assert j["status"] != "succeeded" and j["attempt"] <= 1 and j["error"]["class"] == "snooze", j
    clones = [r for r in (await sim.counters())["requests"] if r["method"] == "POST" and r["path"].endswith("/clone")]
    assert clones == [], clones  # no second clone while the first may land
    # the request lands: the clone runs at 150 (locked), then ends
    tpl = (await sim.vm(9000))["config"]
    cfg = {k: v for k, v in tpl.items() if k not in ("template", "tags")}
    cfg.update(name="web-1", description=marker(server["id"]), scsi0="local-lvm:vm-150-disk-0,size=2G", lock="clone",
               ide2="local-lvm:vm-150-cloudinit,media=cdrom")  # a clone's own drive, as PVE's clone names it
    await sim._req("POST", "/vms", json={"vmid": 150, "node": "pve1", "running": False, "config": cfg})
    await asyncio.sleep(0.5)
    del cfg["lock"]
    await sim._req("POST", "/vms", json={"vmid": 150, "node": "pve1", "running": False, "config": cfg})
    done = await stack.wait_job(job["id"], timeout_s=60)
    assert done["status"] == "succeeded", done
    [ours] = await sim.vms_tagged(f"z9-id-{server['id']}")
    assert ours["vmid"] == 150  # adopted
    assert [v for v in (await sim.state())["vms"] if server["id"] in str(v["config"].get("description", ""))] == [ours]
