"""Volumes through the API, against real PostgreSQL and the Proxmox VE simulator over HTTPS: create, attach
to a running server (its VM's config shows the disk; the guest sees it through the agent), grow online,
detach, attach to a second server, delete, cancel the deletion (re-attached); a server deleted with a
volume attached (the volume survives, available; with delete_volumes both go); the 4xx preconditions;
the volume_gib quota. Assertions are on the world (the simulator's VMs and the guest) and the rows."""
from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from z9.common import store
from z9.common.clock import TestClock

from tests.support import REGION, SimAdmin, Stack, make_tenant, wait_until


async def _settled(stack: Stack, rid: str, timeout_s: float = 90) -> list[dict]:
    async def done() -> list[dict] | None:
        status, out = await stack.call("GET", f"/jobs?resource_id={rid}")
        assert status == 200, out
        jobs = out["jobs"]
        return jobs if jobs and all(j["status"] in ("succeeded", "failed") for j in jobs) else None
    jobs = await wait_until(done, timeout_s, f"the jobs of {rid}")
    assert all(j["status"] == "succeeded" for j in jobs), [(j["kind"], j["status"], j.get("error")) for j in jobs]
    return jobs


async def _server(stack: Stack, name: str) -> dict:
    server, job = await stack.create_server(name)
    assert (await stack.wait_job(job["id"], timeout_s=90))["status"] == "succeeded"
    return await stack.server(server["id"])


async def _volume(stack: Stack, vid: str) -> dict:
    status, out = await stack.call("GET", f"/volumes/{vid}")
    assert status == 200, out
    return out["volume"]


async def _act(stack: Stack, vid: str, action: str, body: Any = None, expect: int = 202) -> dict:
    status, out = await stack.call("POST", f"/volumes/{vid}/actions/{action}", json=body)
    assert status == expect, out
    if expect == 202:
        assert (await stack.wait_job(out["job"]["id"], timeout_s=90))["status"] == "succeeded"
    return out


async def _guest_disks(stack: Stack, server: dict) -> dict[str, int]:
    """What the guest's lsblk shows, run in the guest through the QEMU guest agent (agent/exec)."""
    from z9.executor.proxmox import ProxmoxClient

    pve = ProxmoxClient(REGION, stack.settings.regions[REGION])
    try:
        code, out, err = await pve.agent_exec(server["observed"]["node"], server["observed"]["vmid"],
                                              ["lsblk", "-J", "-b", "-d", "-o", "NAME,SIZE,SERIAL,TYPE"], poll_s=0.05)
    finally:
        pve.close()
    assert code == 0, err
    return {d["serial"]: d["size"] for d in json.loads(out)["blockdevices"] if d["type"] == "disk"}


def _disk_of(config: dict, serial: str) -> str | None:
    return next((k for k, v in config.items() if f"serial={serial}" in str(v)), None)


async def test_create_attach_grow_detach_move_delete_and_cancel(stack: Stack, sim: SimAdmin) -> None:
    a = await _server(stack, "vol-a")
    b = await _server(stack, "vol-b")
    status, out = await stack.call("POST", "/volumes", json={"name": "data", "region": REGION, "size_gib": 4,
                                                              "labels": {"env": "test"}})
    assert status == 202, out
    vid = out["volume"]["id"]
    assert out["volume"]["status"] == "creating" and out["job"]["kind"] == "VolumeCreate"
    created = await _settled(stack, vid)
    # the anchor its create made is found by the job's own record at once: no second attempt
    assert [(j["kind"], j["attempt"]) for j in created] == [("VolumeCreate", 1)], created
    v = await _volume(stack, vid)
    serial = v["observed"]["serial"]
    assert v["status"] == "available" and v["observed"]["server_id"] is None and len(serial) == 20
    assert v["linux_device"].endswith(serial)

    await _act(stack, vid, "attach", {"server_id": a["id"]})
    v = await _volume(stack, vid)
    assert v["status"] == "attached" and v["server_id"] == a["id"]
    cfg = (await sim.vm(a["observed"]["vmid"]))["config"]
    key = _disk_of(cfg, serial)
    assert key is not None and "size=4G" in cfg[key]               # the VM's config shows the disk
    assert (await _guest_disks(stack, a))[serial] == 4 * 1024**3   # the guest sees it

    await _act(stack, vid, "resize", {"size_gib": 6})                # online
    assert (await _guest_disks(stack, a))[serial] == 6 * 1024**3
    assert (await _volume(stack, vid))["size_gib"] == 6

    await _act(stack, vid, "detach")
    v = await _volume(stack, vid)
    assert v["status"] == "available" and v["server_id"] is None
    cfg = (await sim.vm(a["observed"]["vmid"]))["config"]
    assert _disk_of(cfg, serial) is None and not [k for k in cfg if k.startswith("unused")]

    await _act(stack, vid, "attach", {"server_id": b["id"]})
    assert serial in await _guest_disks(stack, b)

    # two-phase delete: detached at once; cancel re-attaches to b
    status, out = await stack.call("DELETE", f"/volumes/{vid}")
    assert status == 202 and out["job"]["kind"] == "VolumeDetach", out
    assert (await stack.wait_job(out["job"]["id"], timeout_s=90))["status"] == "succeeded"
    assert serial not in await _guest_disks(stack, b)
    assert (await _volume(stack, vid))["status"] == "deleting"
    status, out = await stack.call("POST", f"/volumes/{vid}/actions/cancel-deletion")
    assert status == 202 and out["job"]["kind"] == "VolumeAttach", out
    assert (await stack.wait_job(out["job"]["id"], timeout_s=90))["status"] == "succeeded"
    v = await _volume(stack, vid)
    assert v["status"] == "attached" and v["server_id"] == b["id"]
    assert serial in await _guest_disks(stack, b)

    # the filters and labels
    status, out = await stack.call("GET", f"/volumes?server_id={b['id']}&label_selector=env%3Dtest")
    assert status == 200 and [x["id"] for x in out["volumes"]] == [vid]
    status, out = await stack.call("GET", f"/volumes?server_id={a['id']}")
    assert status == 200 and out["volumes"] == []


async def test_a_server_deleted_with_a_volume_attached(stack: Stack, sim: SimAdmin, clock: TestClock) -> None:
    s = await _server(stack, "vol-keep")
    status, out = await stack.call("POST", "/volumes", json={"name": "keep", "region": REGION, "size_gib": 2,
                                                              "server_id": s["id"]})
    assert status == 202, out
    keep = out["volume"]["id"]
    created = await _settled(stack, keep)
    # the anchor its create made is found by the job's own record at once (the attach step after it
    # does not wait for the next listing): one attempt
    assert [(j["kind"], j["attempt"]) for j in created] == [("VolumeCreate", 1)], created
    assert (await _volume(stack, keep))["status"] == "attached"
    status, out = await stack.call("DELETE", f"/servers/{s['id']}")
    assert status == 202, out
    await _settled(stack, keep)
    v = await _volume(stack, keep)
    assert v["status"] == "available" and v["server_id"] is None   # detached first, never destroyed with it
    anchor = v["observed"]["anchor"]
    assert _disk_of((await sim.vm(anchor["vmid"]))["config"], v["observed"]["serial"]) is not None

    s2 = await _server(stack, "vol-gone")
    status, out = await stack.call("POST", "/volumes", json={"name": "gone", "region": REGION, "size_gib": 1,
                                                              "server_id": s2["id"]})
    gone = out["volume"]["id"]
    await _settled(stack, gone)
    status, out = await stack.call("DELETE", f"/servers/{s2['id']}?delete_volumes=maybe")
    assert status == 422 and "delete_volumes" in out["error"]["message"], out
    status, out = await stack.call("DELETE", f"/servers/{s2['id']}?delete_volumes=true")
    assert status == 202, out
    await _settled(stack, gone)  # its VolumeDetach (the deletion's first phase) done
    clock.step(stack.settings.deletion_buffer_s)  # both buffers pass: the reaper's final jobs
    await wait_until(lambda: _status_is(stack, gone, "deleted"), 120, "the volume deleted with its server")
    await wait_until(lambda: _server_gone(stack, s2["id"]), 120, "the server deleted")
    assert not [v for v in (await sim.state())["vms"] if f"z9-id-{gone}" in v["config"].get("tags", "")]


async def test_a_server_restored_gets_back_the_volumes_its_deletion_detached(stack: Stack, sim: SimAdmin) -> None:
    """Cancelling a server's deletion attaches back the volumes that deletion detached — not one the
    customer attached elsewhere meanwhile."""
    s = await _server(stack, "vol-back")
    other = await _server(stack, "vol-other")
    made = {}
    for name in ("back", "moved"):
        status, out = await stack.call("POST", "/volumes", json={"name": name, "region": REGION, "size_gib": 1,
                                                                  "server_id": s["id"]})
        assert status == 202, out
        made[name] = out["volume"]["id"]
    for vid in made.values():
        await _settled(stack, vid)
    status, out = await stack.call("DELETE", f"/servers/{s['id']}")
    assert status == 202, out
    # the answer names every job the request made: the server's and its volumes' detaches
    assert [j["kind"] for j in out["jobs"]] == [out["job"]["kind"], "VolumeDetach", "VolumeDetach"], out["jobs"]
    for vid in made.values():
        await _settled(stack, vid)
        assert (await _volume(stack, vid))["status"] == "available"
    await _act(stack, made["moved"], "attach", {"server_id": other["id"]})  # the customer's own choice since
    await _settled(stack, made["moved"])
    status, out = await stack.call("POST", f"/servers/{s['id']}/actions/cancel-deletion")
    assert status == 202, out
    assert [j["kind"] for j in out["jobs"]] == [out["job"]["kind"], "VolumeAttach"], out["jobs"]
    await stack.wait_job(out["job"]["id"], timeout_s=90)
    await _settled(stack, made["back"])
    back, moved = await _volume(stack, made["back"]), await _volume(stack, made["moved"])
    assert back["status"] == "attached" and back["server_id"] == s["id"], back
    assert moved["status"] == "attached" and moved["server_id"] == other["id"], moved
    vmid = (await stack.server(s["id"]))["observed"]["vmid"]
    assert _disk_of((await sim.vm(vmid))["config"], back["observed"]["serial"]) is not None


async def _server_gone(stack: Stack, sid: str) -> bool:
    return (await stack.server(sid))["status"] == "deleted"


async def _status_is(stack: Stack, vid: str, status: str) -> bool:
    return (await _volume(stack, vid))["status"] == status


async def test_refusals_name_the_field_or_precondition(stack: Stack, sim: SimAdmin) -> None:
    s = await _server(stack, "vol-ref")
    for body, code, word in (
            ({"name": "x", "region": REGION, "size_gib": 10**6}, 422, "size_gib"),
            ({"name": "x", "region": REGION, "size_gib": 20000}, 422, "size_gib"),   # above volume_max_gib
            ({"name": "x", "region": "nowhere", "size_gib": 1}, 422, "region"),
            ({"name": "x", "region": REGION, "size_gib": 1, "server_id": "srv_" + "0" * 26}, 422, "server_id")):
        status, out = await stack.call("POST", "/volumes", json=body)
        assert status == code and word in out["error"]["message"], (body, out)
    status, out = await stack.call("POST", "/volumes", json={"name": "dup", "region": REGION, "size_gib": 1,
                                                              "server_id": s["id"]})
    vid = out["volume"]["id"]
    status, out = await stack.call("POST", "/volumes", json={"name": "dup", "region": REGION, "size_gib": 1})
    assert status == 409 and out["error"]["code"] == "uniqueness_error", out
    await _settled(stack, vid)
    out = await _act(stack, vid, "resize", {"size_gib": 1}, expect=422)
    assert "size_gib" in out["error"]["message"]
    out = await _act(stack, vid, "attach", {"server_id": s["id"]}, expect=409)
    assert out["error"]["code"] == "volume_already_attached"


async def test_volume_gib_quota_is_race_free(stack: Stack, sim: SimAdmin) -> None:
    tenant, token = await make_tenant(stack.pool, "volq")
    await store.tenant_quota_set(stack.pool, tenant, {"volume_gib": 10})

    async def one(i: int) -> int:
        status, _ = await stack.call("POST", "/volumes", json={"name": f"q{i}", "region": REGION, "size_gib": 3},
                                     token=token)
        return status

    got = await asyncio.gather(*(one(i) for i in range(8)))
    assert sorted(got).count(202) == 3 and all(s in (202, 403) for s in got), got
    status, out = await stack.call("GET", "/quota", token=token)
    assert out["quotas"]["volume_gib"] == {"limit": 10, "used": 9}


async def _api_waiters(db: Any) -> int:
    """How many of the API's requests wait on a lock now (the stack's API pool is the test's, named ``z9``;
    the executor, scheduler and reaper have pools of their own)."""
    return await db.fetchval(
        "SELECT count(DISTINCT l.pid) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
        "WHERE NOT l.granted AND a.datname = current_database() AND a.pid <> pg_backend_pid() "
        "AND a.application_name = 'z9'")


async def test_an_attach_racing_the_servers_delete_never_leaves_it_meant_for_a_deleting_server(
        stack: Stack, sim: SimAdmin) -> None:
    """A DELETE of the server and an attach to it in flight at once: either the attach comes first (and the
    delete's hook detaches the volume again) or it is refused (409 resource_deleting) — never a volume meant
    for a server whose deletion has already looked for its volumes."""
    s = await _server(stack, "vol-race")
    status, out = await stack.call("POST", "/volumes", json={"name": "racer", "region": REGION, "size_gib": 1})
    assert status == 202, out
    vid = out["volume"]["id"]
    await _settled(stack, vid)
    (ds, dout), (ast, aout) = await _while_the_servers_delete_is_held(
        stack, s["id"], lambda: stack.call("POST", f"/volumes/{vid}/actions/attach", json={"server_id": s["id"]}))
    assert ds == 202, dout
    assert ast == 409 and aout["error"]["code"] == "resource_deleting", aout
    await _settled(stack, vid)
    v = await _volume(stack, vid)
    assert v["server_id"] is None and v["status"] == "available", v


async def _ge2(db: Any) -> bool:
    return await _api_waiters(db) >= 2


async def _while_the_servers_delete_is_held(stack: Stack, server_id: str, request: Any) -> tuple[Any, Any]:
    """A DELETE of the server held in flight — the jobs table locked: it stops after marking the server
    deleting (its row lock held) and before its hook looks for the server's volumes — and ``request()``
    sent meanwhile, waiting too; then both let go. Returns (the DELETE's answer, the request's)."""
    import asyncpg

    blocker = await asyncpg.connect(stack.settings.database_url)
    try:
        tx = blocker.transaction()
        await tx.start()
        await blocker.execute("LOCK TABLE jobs IN ACCESS EXCLUSIVE MODE")
        delete = asyncio.create_task(stack.call("DELETE", f"/servers/{server_id}"))
        await wait_until(lambda: _api_waiters(blocker), 20, "the DELETE waiting on the held lock", interval_s=0.02)
        other = asyncio.create_task(request())
        await wait_until(lambda: _ge2(blocker), 20, "the other request waiting too", interval_s=0.02)
        await tx.commit()
        first, second = await asyncio.wait_for(asyncio.gather(delete, other), 20)
    finally:
        await blocker.close()
    return first, second


async def test_a_cancelled_deletion_racing_the_servers_delete_never_gives_the_volume_to_a_deleting_server(
        stack: Stack, sim: SimAdmin) -> None:
    """A volume's cancel-deletion gives it back to the server it was on — unless that server is being
    deleted. With the server's DELETE in flight (marked deleting under its row lock, its hook not yet
    run), the cancel waits for it and then leaves the volume on no server (available): never meant for a
    server whose deletion has already looked for its volumes."""
    s = await _server(stack, "vol-cancel-race")
    status, out = await stack.call("POST", "/volumes", json={"name": "back", "region": REGION, "size_gib": 1,
                                                              "server_id": s["id"]})
    assert status == 202, out
    vid = out["volume"]["id"]
    await _settled(stack, vid)
    status, out = await stack.call("DELETE", f"/volumes/{vid}")
    assert status == 202, out
    await _settled(stack, vid)
    assert (await _volume(stack, vid))["status"] == "deleting"
    (ds, dout), (cs, cout) = await _while_the_servers_delete_is_held(
        stack, s["id"], lambda: stack.call("POST", f"/volumes/{vid}/actions/cancel-deletion"))
    assert ds == 202, dout
    assert cs == 202, cout
    await _settled(stack, vid)
    v = await _volume(stack, vid)
    assert v["server_id"] is None and v["status"] == "available", v


async def test_a_volume_whose_create_failed_but_that_was_in_use_since_keeps_its_deletion_buffer(
        stack: Stack, sim: SimAdmin) -> None:
    """The 'no buffer for a failed create' shortcut is for a resource nothing of which was ever in use:
    a volume whose create failed at its attach (its disk made) and that a later job put to use goes
    through the buffer like any other — cancellable, never destroyed at once."""
    s = await _server(stack, "vol-buffer")
    sim.allow_rejections = True  # the injected fault answers 400
    await sim.fault(method="POST", path=r"/move_disk$", action="error", status=400, reason="simulated refusal", times=1)
    status, out = await stack.call("POST", "/volumes", json={"name": "kept", "region": REGION, "size_gib": 1,
                                                              "server_id": s["id"]})
    assert status == 202, out
    vid = out["volume"]["id"]
    assert (await stack.wait_job(out["job"]["id"], timeout_s=90))["status"] == "failed"
    await _act(stack, vid, "detach")             # a job of it succeeds: it is in use from now on
    await _act(stack, vid, "attach", {"server_id": s["id"]})
    # and a later job fails: the volume is failed again, with its data on the server
    await sim.fault(method="PUT", path=r"/resize$", action="error", status=400, reason="simulated refusal", times=1)
    status, out = await stack.call("POST", f"/volumes/{vid}/actions/resize", json={"size_gib": 2})
    assert status == 202, out
    assert (await stack.wait_job(out["job"]["id"], timeout_s=90))["status"] == "failed"
    assert (await _volume(stack, vid))["status"] == "failed"
    status, out = await stack.call("DELETE", f"/volumes/{vid}")
    assert status == 202, out
    assert out["volume"]["status"] == "deleting" and out["volume"]["delete_after"] is not None, out
    assert out["job"]["kind"] == "VolumeDetach", out


async def test_a_server_takes_a_bounded_number_of_volumes(stack: Stack, sim: SimAdmin,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """More volumes than a server takes are refused at the request (409 server_volume_limit), never accepted
    and then failed by the job for want of a free SCSI slot (the limit lowered to 1 for the test)."""
    from z9.resources.volume import api as volume_api

    monkeypatch.setattr(volume_api, "MAX_VOLUMES_PER_SERVER", 1)
    s = await _server(stack, "vol-limit")
    status, out = await stack.call("POST", "/volumes", json={"name": "one", "region": REGION, "size_gib": 1,
                                                              "server_id": s["id"]})
    assert status == 202, out
    first = out["volume"]["id"]
    status, out = await stack.call("POST", "/volumes", json={"name": "two", "region": REGION, "size_gib": 1,
                                                              "server_id": s["id"]})
    assert status == 409 and out["error"]["code"] == "server_volume_limit", out
    status, out = await stack.call("POST", "/volumes", json={"name": "two", "region": REGION, "size_gib": 1})
    assert status == 202, out
    second = out["volume"]["id"]
    await _settled(stack, first)
    await _settled(stack, second)
    status, out = await stack.call("POST", f"/volumes/{second}/actions/attach", json={"server_id": s["id"]})
    assert status == 409 and out["error"]["code"] == "server_volume_limit", out
    assert out["error"]["details"] == [{"kind": "server", "id": s["id"], "limit": 1}], out
    await _act(stack, first, "detach")
    await _act(stack, second, "attach", {"server_id": s["id"]})


async def test_a_failed_detach_can_be_asked_again(stack: Stack, sim: SimAdmin) -> None:
    """A detach whose job failed leaves the disk on the server it was last seen on, the volume failed and
    meant for none: detach again is accepted (its disk is taken off that server), not 409 volume_not_attached."""
    s = await _server(stack, "vol-redetach")
    status, out = await stack.call("POST", "/volumes", json={"name": "stuck", "region": REGION, "size_gib": 1,
                                                              "server_id": s["id"]})
    assert status == 202, out
    vid = out["volume"]["id"]
    await _settled(stack, vid)
    sim.allow_rejections = True  # the injected fault answers 400
    await sim.fault(method="POST", path=r"/move_disk$", action="error", status=400, reason="simulated refusal", times=1)
    status, out = await stack.call("POST", f"/volumes/{vid}/actions/detach")
    assert status == 202, out
    assert (await stack.wait_job(out["job"]["id"], timeout_s=90))["status"] == "failed"
    v = await _volume(stack, vid)
    assert v["status"] == "failed" and v["server_id"] is None and v["observed"]["server_id"] == s["id"], v
    await _act(stack, vid, "detach")
    v = await _volume(stack, vid)
    assert v["status"] == "available" and v["observed"]["server_id"] is None, v
    cfg = (await sim.vm(s["observed"]["vmid"]))["config"]
    assert _disk_of(cfg, v["observed"]["serial"]) is None and not [k for k in cfg if k.startswith("unused")]
    status, out = await stack.call("POST", f"/volumes/{vid}/actions/detach")
    assert status == 409 and out["error"]["code"] == "volume_not_attached", out
