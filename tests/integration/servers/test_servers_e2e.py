"""Servers end to end through the job table, against the Proxmox VE simulator over HTTPS
(issue 2, tests 1-9). Assertions are on the state of the world (the simulator's VMs and tasks,
the database rows), not on the calls made."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from typing import Any

import pytest
from proxmoxer import ProxmoxAPI

from z9.common import store
from z9.common.tags import identity_tag, normalize_tags
from z9.common.clock import TestClock

from tests.support import REGION, SimAdmin, Stack, wait_until


async def _tasks(sim: SimAdmin, kind: str) -> int:
    return (await sim.counters())["tasks_started"].get(kind, 0)


async def _created(stack: Stack, sim: SimAdmin, name: str = "web-1") -> tuple[dict, dict]:
    server, job = await stack.create_server(name)
    done = await stack.wait_job(job["id"])
    assert done["status"] == "succeeded", done
    return await stack.server(server["id"]), done


async def _rerun(stack: Stack, job_id: str) -> dict:
    """An operator re-running a finished job: the same kind, args and resource, as a new job."""
    old = await store.job_get(stack.pool, job_id)
    async with stack.pool.acquire() as conn, conn.transaction():
        new = await store.job_insert(conn, store.NewJob(
            kind=old.kind, region=old.region, tenant_id=old.tenant_id, resource_type=old.resource_type,
            resource_id=old.resource_id, args=old.args))
    return await stack.wait_job(new.id)


# 1
async def test_create_server_end_to_end(stack: Stack, sim: SimAdmin) -> None:
    server, job = await _created(stack, sim)
    assert [s["name"] for s in job["steps"]] == ["clone", "configure", "resize_disk", "firewall", "start"]
    assert all(s["state"] == "done" for s in job["steps"])
    assert job["steps"][0]["detail"]["upid"].startswith("UPID:pve1:")
    vms = await sim.vms_tagged(identity_tag(server["id"]))
    assert len(vms) == 1
    vm = vms[0]
    assert vm["running"] and not vm["lock"]
    assert normalize_tags(vm["config"]["tags"]) == {identity_tag(server["id"]), "z9-member-main", "z9-role-customer"}
    assert vm["config"]["cores"] in ("2", 2) and str(vm["config"]["memory"]) == "2048"
    assert "size=10G" in vm["config"]["scsi0"]
    assert server["status"] == "running"
    assert server["observed"] == {"vmid": vm["vmid"], "node": vm["node"], "power_state": "running",
                                  "at": server["observed"]["at"]}


# 2
async def test_rerun_create_is_a_no_op(stack: Stack, sim: SimAdmin) -> None:
    server, job = await _created(stack, sim)
    before_state, before_mut = await sim.state(), await sim.mutations()
    again = await _rerun(stack, job["id"])
    assert again["status"] == "succeeded" and again["steps"] == []
    assert await sim.mutations() == before_mut
    after_state = await sim.state()
    assert [v["config"] for v in after_state["vms"]] == [v["config"] for v in before_state["vms"]]


# 3
async def test_rename_out_of_band_found_by_tag(stack: Stack, sim: SimAdmin) -> None:
    server, job = await _created(stack, sim)
    vmid, node = server["observed"]["vmid"], server["observed"]["node"]
    pve = ProxmoxAPI("127.0.0.1", port=sim.server.port, user="root@pam", token_name="z9",
                     token_value=sim.server.token_secret, verify_ssl=str(sim.server.cert_path))
    await asyncio.to_thread(lambda: pve.nodes(node).qemu(vmid).config.put(name="renamed-by-operator"))
    again = await _rerun(stack, job["id"])
    assert again["status"] == "succeeded"
    assert [s["name"] for s in again["steps"]] == ["configure"]  # the name is z9's: put back
    vms = await sim.vms_tagged(identity_tag(server["id"]))
    assert len(vms) == 1 and vms[0]["vmid"] == vmid
    assert vms[0]["config"]["name"] == "web-1"
    assert await _tasks(sim, "qmclone") == 1


# 4
async def test_delete_then_cancel_within_buffer(stack: Stack, sim: SimAdmin) -> None:
    server, _ = await _created(stack, sim)
    vmid = server["observed"]["vmid"]
    status, out = await stack.call("DELETE", f"/servers/{server['id']}")
    assert status == 202, out
    assert out["server"]["status"] == "deleting" and out["server"]["delete_after"]
    assert out["job"]["kind"] == "ServerStop"
    stop = await stack.wait_job(out["job"]["id"])
    assert stop["status"] == "succeeded", stop
    assert not (await sim.vm(vmid))["running"]
    s = await stack.server(server["id"])
    assert s["status"] == "deleting" and s["observed"]["power_state"] == "stopped"

    status, out = await stack.call("POST", f"/servers/{server['id']}/actions/cancel-deletion")
    assert status == 202, out
    assert out["job"]["kind"] == "ServerStart"
    start = await stack.wait_job(out["job"]["id"])
    assert start["status"] == "succeeded", start
    s = await stack.server(server["id"])
    assert s["status"] == "running" and s["observed"]["power_state"] == "running"
    assert (await sim.vm(vmid))["running"]
    assert await _tasks(sim, "qmdestroy") == 0


# 5
async def test_delete_after_buffer_destroys_vm(stack: Stack, sim: SimAdmin, clock: TestClock) -> None:
    server, _ = await _created(stack, sim)
    status, out = await stack.call("DELETE", f"/servers/{server['id']}")
    assert status == 202
    await stack.wait_job(out["job"]["id"])
    clock.step(stack.settings.deletion_buffer_s)  # the buffer passes
    await _wait_status(stack, server["id"], "deleted")
    assert await sim.vms_tagged(identity_tag(server["id"])) == []
    status, jobs = await stack.call("GET", f"/jobs?resource_id={server['id']}")
    kinds = [(j["kind"], j["status"]) for j in jobs["jobs"]]
    assert kinds == [("ServerCreate", "succeeded"), ("ServerStop", "succeeded"), ("ServerDelete", "succeeded")]
    agent = await sim.vm(100)
    assert agent is not None and agent["running"]
    status, out = await stack.call("POST", f"/servers/{server['id']}/actions/cancel-deletion")
    assert status == 409 and "deleted" in out["error"]["message"]


# 6
@pytest.mark.parametrize("stale_from", ["before_stop", "before_destroy"])
async def test_stale_row_pointing_at_agent_is_refused(stack: Stack, sim: SimAdmin, clock: TestClock,
                                                      stale_from: str) -> None:
    """A server whose VM never came to be, and whose (stale) row points at the agent's vmid.
    Whichever job of the deletion touches VMs first refuses; the agent is never touched."""
    await stack.stop_service("executor")
    server, job = await stack.create_server("ghost")
    await stack.pool.execute("UPDATE jobs SET status = 'failed', finished_at = now(), "
                             "error = '{\"class\": \"permanent\", \"message\": \"test\"}' WHERE id = $1", job["id"])
    stale = ("UPDATE servers SET vmid = 100, node = 'pve1', power_state = 'running', status = "
             "CASE WHEN status = 'creating' THEN 'running'::server_status ELSE status END WHERE id = $1")
    if stale_from == "before_stop":
        await stack.pool.execute(stale, server["id"])
    await stack.start_service("executor")
    status, out = await stack.call("DELETE", f"/servers/{server['id']}")
    assert status == 202
    stop = await stack.wait_job(out["job"]["id"])
    if stale_from == "before_stop":
        refused = stop
    else:
        assert stop["status"] == "succeeded", stop
        await stack.pool.execute(stale, server["id"])
        clock.step(stack.settings.deletion_buffer_s)  # the buffer passes: the final delete is enqueued

        async def final_done() -> dict | None:
            status, jobs = await stack.call("GET", f"/jobs?resource_id={server['id']}")
            final = [j for j in jobs["jobs"] if j["kind"] == "ServerDelete"]
            return final[0] if final and final[0]["status"] in ("succeeded", "failed") else None
        refused = await wait_until(final_done, 20, "the final delete to end")
    assert refused["status"] == "failed" and refused["attempt"] == 1, refused
    assert refused["error"]["class"] == "permanent"
    assert "z9-role-agent" in refused["error"]["message"]
    s = await stack.server(server["id"])
    assert s["status"] == "failed" and "z9-role-agent" in s["status_reason"]
    # past the buffer: nothing else may happen to the agent (a failed server is not reaped)
    clock.step(stack.settings.deletion_buffer_s)
    assert await stack.services["reaper"].run_once() == 0
    status, jobs = await stack.call("GET", f"/jobs?resource_id={server['id']}")
    assert all(j["status"] in ("succeeded", "failed") for j in jobs["jobs"]), jobs
    agent = await sim.vm(100)
    assert agent is not None and agent["running"]
    for kind in ("qmdestroy", "qmstop", "qmshutdown"):
        assert await _tasks(sim, kind) == 0, kind


# 7
@pytest.mark.settings(backoff_base_s=1.0)
async def test_lock_timeout_retries_then_succeeds(stack: Stack, sim: SimAdmin) -> None:
    # a flock timeout is PVE saying it did nothing: the call is tried again within the step
    # (CALL_TRIES times); one that outlasts those ends the attempt, and the job retries
    from z9.executor.proxmox import CALL_TRIES

    await sim.fault(method="POST", path=r"^/nodes/[^/]+/qemu/\d+/clone$", action="error", status=500,
                    reason="can't lock file '/var/lock/qemu-server/lock-9000.conf' - got timeout", times=CALL_TRIES)
    server, job = await stack.create_server()
    seen: list[str] = []
    server_statuses = set()

    async def terminal() -> dict | None:  # the job's statuses and the server's, sampled together
        server_statuses.add((await stack.server(server["id"]))["status"])
        j = await stack.job(job["id"])
        if not seen or seen[-1] != j["status"]:
            seen.append(j["status"])
        return j if j["status"] in ("succeeded", "failed") else None
    done = await wait_until(terminal, 30, "the create terminal")
    assert done["status"] == "succeeded", done
    assert "retry" in seen, seen
    assert done["attempt"] == 2
    assert "failed" not in server_statuses, server_statuses
    assert (await stack.server(server["id"]))["status"] == "running"
    assert len(await sim.vms_tagged(identity_tag(server["id"]))) == 1


# 8
@pytest.mark.settings(snooze_limit_s=1.5, max_attempts=2)
async def test_missing_template_is_waited_for_then_fails_naming_it(stack: Stack, sim: SimAdmin,
                                                                   clock: TestClock) -> None:
    """No template of that name: waiting on the world (it may be being imported; issue 8) — the
    server stays creating and no attempt is spent — until the wait passes snooze_limit_s; then the
    job fails with the reason naming the image, and nothing was cloned."""
    await sim.delete_vm(9000)
    server, job = await stack.create_server()

    async def snoozed() -> dict | None:
        j = await stack.job(job["id"])
        return j if j["status"] == "failed" or (j["error"] or {}).get("class") == "snooze" else None
    waiting = await wait_until(snoozed, 20, "the create waiting on the world")
    assert waiting["status"] != "failed" and waiting["error"]["class"] == "snooze", waiting
    assert (await stack.server(server["id"]))["status"] == "creating"
    clock.step(stack.settings.snooze_limit_s)  # the wait passes snooze_limit_s
    done = await stack.wait_job(job["id"], timeout_s=30)
    assert done["status"] == "failed" and "template" in done["error"]["message"], done
    s = await stack.server(server["id"])
    assert s["status"] == "failed" and "debian-12" in s["status_reason"]
    assert await _tasks(sim, "qmclone") == 0


# 9
@pytest.mark.settings(lease_ttl_s=2)
async def test_sigkill_during_clone_second_executor_finishes(stack: Stack, sim: SimAdmin) -> None:
    await stack.stop_service("executor")
    await sim.configure(task_seconds={"qmclone": 3.0})
    s = stack.settings
    env = dict(os.environ, Z9_DATABASE_URL=s.database_url, Z9_LEASE_TTL_S="2", Z9_HEARTBEAT_S="0.5",
               Z9_TASK_POLL_S="0.1", Z9_POLL_INTERVAL_S="0.5", Z9_REGIONS=json.dumps(
                   {REGION: {"url": s.regions[REGION].url, "token_id": s.regions[REGION].token_id,
                             "token_secret": s.regions[REGION].token_secret.get_secret_value(),
                             "verify_ssl": False}}))
    proc = subprocess.Popen([sys.executable, "-m", "z9", "executor", "--region", REGION], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        server, job = await stack.create_server()
        # until the clone task runs on the hypervisor and the job has recorded its UPID
        await wait_until(lambda: _task_recorded(stack, sim, job["id"]), 20, "the clone running, its UPID recorded")
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    await stack.start_service("executor")
    done = await stack.wait_job(job["id"], timeout_s=40)
    assert done["status"] == "succeeded", done
    assert done["attempt"] == 2  # the killed attempt counts
    # The second attempt resumed the first one's clone (waited on it or adopted it).
    assert done["steps"][0]["name"] in ("wait_clone", "configure"), done["steps"]
    assert await _tasks(sim, "qmclone") == 1
    vms = await sim.vms_tagged(identity_tag(server["id"]))
    assert len(vms) == 1 and vms[0]["running"]
    assert (await stack.server(server["id"]))["status"] == "running"


# proxmox-api.md, "Where peers broke" 1: the clone's response is lost but the task ran.
async def test_lost_clone_response_never_makes_a_second_vm(stack: Stack, sim: SimAdmin) -> None:
    await sim.fault(method="POST", path=r"/clone$", action="drop", times=1)
    server, job = await stack.create_server()
    done = await stack.wait_job(job["id"])
    assert done["status"] == "succeeded" and done["attempt"] == 2, done
    assert await _tasks(sim, "qmclone") == 1
    assert len(await sim.vms_tagged(identity_tag(server["id"]))) == 1
    assert len([v for v in (await sim.state())["vms"] if not v["template"]]) == 2  # the agent and ours


# "Where peers broke" 2: parallel creates all get the same nextid; losers pick again.
async def test_parallel_creates_get_distinct_vms(stack: Stack, sim: SimAdmin) -> None:
    made = [await stack.create_server(f"p-{i}") for i in range(6)]
    results = await asyncio.gather(*(stack.wait_job(j["id"]) for _, j in made))
    assert all(r["status"] == "succeeded" for r in results), results
    vmids = set()
    for server, _ in made:
        vms = await sim.vms_tagged(identity_tag(server["id"]))
        assert len(vms) == 1
        vmids.add(vms[0]["vmid"])
    assert len(vmids) == 6 and 100 not in vmids


@pytest.mark.settings(backoff_base_s=0.5)
async def test_failed_task_is_retried_with_its_log_shown(stack: Stack, sim: SimAdmin) -> None:
    await sim.fault(method="POST", path=r"/status/start$", action="fail_task",
                    exitstatus="start failed: QEMU exited with code 1", times=1)
    server, job = await stack.create_server()
    seen: list[str] = []
    async def retrying() -> dict | None:
        j = await stack.job(job["id"])
        return j if j["status"] == "retry" else None
    retried = await wait_until(retrying, 20, "the job in retry", interval_s=0.02)
    assert retried["error"]["class"] == "temporary" and "QEMU exited" in retried["error"]["message"]
    assert any("TASK ERROR" in line for line in retried["error"]["task_log"])
    assert [s["state"] for s in retried["steps"]][-1] == "failed"
    done = await stack.wait_job(job["id"], seen=seen)
    assert done["status"] == "succeeded" and done["steps"] and done["steps"][-1]["name"] == "start"
    assert (await stack.server(server["id"]))["status"] == "running"


@pytest.mark.settings(shutdown_grace_s=0.2)
async def test_sigterm_hands_a_long_job_over(stack: Stack, sim: SimAdmin) -> None:
    await sim.configure(task_seconds={"qmclone": 2.0})
    server, job = await stack.create_server()
    await wait_until(lambda: _tasks_are(sim, "qmclone", 1), 20, "the clone running", interval_s=0.02)
    await stack.stop_service("executor")  # what SIGTERM calls
    j = await stack.job(job["id"])
    assert j["status"] in ("retry", "pending") and j["attempt"] == 0, j  # handed over, attempt given back
    assert "handed over" in j["error"]["message"]
    await stack.start_service("executor")
    done = await stack.wait_job(job["id"])
    assert done["status"] == "succeeded" and done["attempt"] == 1
    assert await _tasks(sim, "qmclone") == 1
    assert len(await sim.vms_tagged(identity_tag(server["id"]))) == 1


async def _tasks_are(sim: SimAdmin, task_type: str, n: int) -> bool:
    return await _tasks(sim, task_type) == n


async def _task_recorded(stack: Stack, sim: SimAdmin, job_id: str) -> bool:
    """The job's first task runs on the hypervisor and its UPID is in the job's steps."""
    steps = (await stack.job(job_id))["steps"]
    return await _tasks(sim, "qmclone") == 1 and bool(steps and steps[0]["detail"].get("upid"))


async def _wait_status(stack: Stack, server_id: str, status: str, timeout_s: float = 20) -> dict:
    async def there() -> dict | None:
        s = await stack.server(server_id)
        return s if s["status"] == status else None
    return await wait_until(there, timeout_s, f"server {server_id} {status}")


@pytest.mark.settings(deletion_buffer_s=0.3)
async def test_delete_removes_an_untagged_clone_left_by_a_failed_create(stack: Stack, sim: SimAdmin) -> None:
    sim.allow_rejections = True  # the injected fault answers 400
    await sim.fault(method="PUT", path=r"/qemu/\d+/config$", action="error", status=400,
                    reason="Parameter verification failed.", times=1)
    server, job = await stack.create_server()
    failed = await stack.wait_job(job["id"])
    assert failed["status"] == "failed" and failed["steps"][0]["name"] == "clone"
    marker = f"z9 resource {server['id']}"
    leaked = [v for v in (await sim.state())["vms"] if marker in str(v["config"].get("description", ""))]
    assert len(leaked) == 1 and not leaked[0]["config"].get("tags", "").count("z9-id-")
    status, out = await stack.call("DELETE", f"/servers/{server['id']}")
    assert status == 202
    await _wait_status(stack, server["id"], "deleted")
    assert await sim.vm(leaked[0]["vmid"]) is None
    assert (await sim.vm(100))["running"]


async def test_a_failure_during_the_buffer_does_not_undo_the_deletion(stack: Stack, sim: SimAdmin,
                                                                      clock: TestClock) -> None:
    sim.allow_rejections = True
    await stack.stop_service("executor")
    await sim.fault(method="POST", path=r"/clone$", action="error", status=400,
                    reason="Parameter verification failed.", times=1)
    server, job = await stack.create_server()
    status, out = await stack.call("DELETE", f"/servers/{server['id']}")
    assert status == 202
    await stack.start_service("executor")
    assert (await stack.wait_job(job["id"]))["status"] == "failed"
    s = await stack.server(server["id"])
    assert s["status"] == "deleting" and "400" in s["status_reason"]  # the reason, and still deleting
    clock.step(stack.settings.deletion_buffer_s)  # the buffer passes
    await _wait_status(stack, server["id"], "deleted")


async def test_cancel_restores_running_even_after_repeated_delete_and_cancel(stack: Stack, sim: SimAdmin) -> None:
    server, _ = await _created(stack, sim)
    sid = server["id"]
    await sim.fault(method="POST", path=r"/status/start$", action="delay", seconds=1.0, times=1)
    for _ in range(2):
        assert (await stack.call("DELETE", f"/servers/{sid}"))[0] == 202
        status, out = await stack.call("POST", f"/servers/{sid}/actions/cancel-deletion")
        assert status == 202 and out["job"]["kind"] == "ServerStart"
    done = await stack.wait_job(out["job"]["id"])
    assert done["status"] == "succeeded"
    s = await stack.server(sid)
    assert s["status"] == "running" and s["observed"]["power_state"] == "running"
    assert (await sim.vm(s["observed"]["vmid"]))["running"]


async def test_cancel_of_a_failed_server_keeps_it_failed_with_its_reason(stack: Stack, sim: SimAdmin) -> None:
    # a server that was created and failed later (a failed create's deletion has no buffer to cancel)
    server, job = await stack.create_server()
    assert (await stack.wait_job(job["id"]))["status"] == "succeeded"
    reason = "ServerStart failed: the node is down"
    await stack.pool.execute("UPDATE servers SET status = 'failed', status_reason = $2 WHERE id = $1",
                             server["id"], reason)
    assert (await stack.call("DELETE", f"/servers/{server['id']}"))[0] == 202
    status, out = await stack.call("POST", f"/servers/{server['id']}/actions/cancel-deletion")
    assert status == 202
    assert (await stack.wait_job(out["job"]["id"]))["status"] == "succeeded"
    s = await stack.server(server["id"])
    assert s["status"] == "failed" and s["status_reason"] == reason


async def test_disk_smaller_than_the_image_fails_before_cloning(stack: Stack, sim: SimAdmin) -> None:
    server, job = await stack.create_server(disk_gib=1)
    done = await stack.wait_job(job["id"])
    assert done["status"] == "failed" and "cannot shrink" in done["error"]["message"]
    assert await _tasks(sim, "qmclone") == 0


@pytest.mark.settings(snooze_limit_s=0.5, max_attempts=2)
async def test_a_stale_vm_lock_is_waited_on_then_surfaces(stack: Stack, sim: SimAdmin) -> None:
    server, _ = await _created(stack, sim)
    vm = await sim.vm(server["observed"]["vmid"])
    await sim.set_config(vm["vmid"], lock="backup")
    status, out = await stack.call("DELETE", f"/servers/{server['id']}")
    seen: list[str] = []
    done = await stack.wait_job(out["job"]["id"], seen=seen)
    assert "retry" in seen
    assert done["status"] == "failed" and "locked (backup)" in done["error"]["message"]
    assert "longer than" in done["error"]["message"]
    assert (await sim.vm(vm["vmid"]))["running"]  # never touched while locked


@pytest.mark.settings(deletion_buffer_s=0.3)
async def test_vms_are_protected_against_stray_destroys(stack: Stack, sim: SimAdmin) -> None:
    from proxmoxer.core import ResourceException

    server, _ = await _created(stack, sim)
    vmid, node = server["observed"]["vmid"], server["observed"]["node"]
    assert str((await sim.vm(vmid))["config"].get("protection")) == "1"
    pve = ProxmoxAPI("127.0.0.1", port=sim.server.port, user="root@pam", token_name="z9",
                     token_value=sim.server.token_secret, verify_ssl=str(sim.server.cert_path))
    await asyncio.to_thread(lambda: pve.nodes(node).qemu(vmid).status.stop.post())

    async def stopped() -> bool:
        return not (await sim.vm(vmid))["running"]
    await wait_until(stopped, 20, f"VM {vmid} stopped")
    with pytest.raises(ResourceException, match="protection"):  # e.g. a late request aimed at a reused vmid
        await asyncio.to_thread(lambda: pve.nodes(node).qemu(vmid).delete())
    assert await sim.vm(vmid) is not None
    assert (await stack.call("DELETE", f"/servers/{server['id']}"))[0] == 202
    await _wait_status(stack, server["id"], "deleted")
    assert await sim.vm(vmid) is None


@pytest.mark.settings(deletion_buffer_s=0.2)
async def test_a_failure_after_the_buffer_does_not_stop_the_final_delete(stack: Stack, sim: SimAdmin) -> None:
    sim.allow_rejections = True
    server, _ = await _created(stack, sim)
    await stack.stop_service("executor")
    status, out = await stack.call("DELETE", f"/servers/{server['id']}")
    await _wait_status(stack, server["id"], "destroying")  # the reaper ran; ServerStop still queued
    await sim.fault(method="GET", path=r"^/cluster/resources$", action="error", status=400,
                    reason="Parameter verification failed.", times=1)
    await stack.start_service("executor")
    stop = await stack.wait_job(out["job"]["id"])
    assert stop["status"] == "failed"
    s = await stack.server(server["id"])
    assert s["status"] in ("destroying", "deleted")  # never failed: the deletion was final
    status, out = await stack.call("POST", f"/servers/{server['id']}/actions/cancel-deletion")
    assert status == 409
    await _wait_status(stack, server["id"], "deleted")
    assert await sim.vms_tagged(identity_tag(server["id"])) == []


@pytest.mark.settings(deletion_buffer_s=600)
async def test_a_superseded_final_delete_does_nothing(stack: Stack, sim: SimAdmin, clock: TestClock) -> None:
    server, _ = await _created(stack, sim)
    vmid = server["observed"]["vmid"]
    await stack.stop_service("executor")
    await stack.call("DELETE", f"/servers/{server['id']}")
    clock.step(601)  # past the buffer: the reaper enqueues the final delete
    await _wait_status(stack, server["id"], "destroying")
    # The server failed meanwhile (an operator, a lease lost after the last attempt), and its
    # owner deletes it again, its buffer 600 s from now: the queued ServerDelete must not destroy it.
    await stack.pool.execute("UPDATE servers SET status = 'failed', status_reason = 'x' WHERE id = $1", server["id"])
    assert (await stack.call("DELETE", f"/servers/{server['id']}"))[0] == 202
    await stack.start_service("executor")
    status, jobs = await stack.call("GET", f"/jobs?resource_id={server['id']}")
    final = next(j for j in jobs["jobs"] if j["kind"] == "ServerDelete")
    done = await stack.wait_job(final["id"])
    assert done["status"] == "succeeded" and done["steps"] == []
    assert await sim.vm(vmid) is not None
    status, out = await stack.call("POST", f"/servers/{server['id']}/actions/cancel-deletion")
    assert status == 202


async def test_platform_roles_are_never_rewritten(stack: Stack, sim: SimAdmin) -> None:
    server, job = await _created(stack, sim)
    vm = await sim.vm(server["observed"]["vmid"])
    await sim.set_config(vm["vmid"], tags=vm["config"]["tags"] + ";z9-role-platform")
    again = await _rerun(stack, job["id"])
    assert again["status"] == "failed" and "z9-role-platform" in again["error"]["message"]
    assert "z9-role-platform" in (await sim.vm(vm["vmid"]))["config"]["tags"]


async def test_a_template_with_a_platform_role_is_not_cloned(stack: Stack, sim: SimAdmin) -> None:
    await sim.set_config(9000, tags="z9-image;z9-role-platform")
    server, job = await stack.create_server()
    done = await stack.wait_job(job["id"])
    assert done["status"] == "failed" and "z9-role-platform" in done["error"]["message"]
    assert await _tasks(sim, "qmclone") == 0


@pytest.mark.settings(deletion_buffer_s=0.1, uncertain_window_s=600.0)
async def test_delete_after_the_create_adopted_a_clone_whose_answer_was_lost_does_not_wait(stack: Stack,
                                                                                          sim: SimAdmin) -> None:
    """The clone's answer was dropped (performed, unanswered): the create's retry found the VM by the
    recorded vmid and took it — the request's outcome is known then, recorded as answered, and the final
    delete does not wait out the window (600 s here; it waited it out before)."""
    await sim.fault(method="POST", path=r"/clone$", action="drop", times=1)
    server, job = await stack.create_server()
    assert (await stack.wait_job(job["id"]))["status"] == "succeeded"
    # the request whose answer was dropped: answered once the retry adopted its VM
    [req] = await store.vm_clone_requests(stack.pool, server["id"])
    assert req.vmid == (await stack.server(server["id"]))["observed"]["vmid"] and req.uncertain_since is None, req
    assert (await stack.call("DELETE", f"/servers/{server['id']}"))[0] == 202
    await _wait_status(stack, server["id"], "deleted")  # well within the window
    assert [v for v in (await sim.state())["vms"] if server["id"] in str(v["config"].get("description", ""))] == []
    assert await store.vm_clone_requests(stack.pool, server["id"]) == []  # they go with the server


@pytest.mark.settings(deletion_buffer_s=0.1, uncertain_window_s=60.0)
async def test_delete_waits_out_a_clone_request_that_may_still_land(stack: Stack, sim: SimAdmin,
                                                                  clock: TestClock) -> None:
    """A clone request of the server's recorded and never answered (its sender died after recording
    it), whose VM did not appear: the final delete waits the window out (a snooze, no attempt) — the
    clone may still land and would be left behind — and ends once the window has passed."""
    server, job = await stack.create_server()
    assert (await stack.wait_job(job["id"]))["status"] == "succeeded"
    await stack.pool.execute(  # what a dead sender of another attempt left: recorded, never answered
        "INSERT INTO vm_clone_requests (resource_id, member, vmid, node, job_id) VALUES ($1, 'main', 170, 'pve1', $2)",
        server["id"], job["id"])
    assert (await stack.call("DELETE", f"/servers/{server['id']}"))[0] == 202

    async def held() -> dict | None:
        _, out = await stack.call("GET", f"/jobs?resource_id={server['id']}")
        final = [j for j in out["jobs"] if j["kind"] == "ServerDelete"]
        return final[0] if final and final[0]["status"] == "retry" and (final[0].get("error") or {}).get(
            "class") == "snooze" else None
    final = await wait_until(held, 60, "the final delete waiting out the unanswered request")
    assert "may still be performed" in final["error"]["message"], final
    clock.step(60)
    await _wait_status(stack, server["id"], "deleted")
    _, jobs = await stack.call("GET", f"/jobs?resource_id={server['id']}")
    assert next(j for j in jobs["jobs"] if j["kind"] == "ServerDelete")["attempt"] == 1  # snoozes gave it back
    assert await store.vm_clone_requests(stack.pool, server["id"]) == []


@pytest.mark.settings(region={"request_timeout_s": 1.0}, uncertain_window_s=5.0)
async def test_lost_clone_answer_landing_late_still_makes_one_vm(stack: Stack, sim: SimAdmin) -> None:
    await stack.stop_service("executor")
    await sim.fault(method="POST", path=r"/clone$", action="delay", seconds=2.0, times=1)  # lands after the timeout
    await stack.start_service("executor")
    server, job = await stack.create_server()
    done = await stack.wait_job(job["id"], timeout_s=60)
    assert done["status"] == "succeeded", done
    mine = [v for v in (await sim.state())["vms"] if server["id"] in str(v["config"].get("description", ""))]
    assert len(mine) == 1, mine
    assert await _tasks(sim, "qmclone") == 1


@pytest.mark.settings(step_timeout_s=1.0, lease_ttl_s=2.0, heartbeat_s=0.5)
async def test_no_lease_renewal_without_hypervisor_answers(stack: Stack, sim: SimAdmin) -> None:
    await stack.stop_service("executor")
    await stack.start_service("executor")
    await sim.fault(method="GET", path=r"/tasks/.*/status$", action="error", status=595,
                    reason="Connection refused", probability=1.0)
    server, job = await stack.create_server()
    # The event is the lease's expiry being recorded; how long it takes depends on the machine's load
    # (a step timeout, then a whole TTL without renewal), so the wait is bounded by a generous deadline,
    # not by a count of polls (15 s of polls ran out under a loaded CI).
    async def expired() -> Any:
        row = await stack.pool.fetchrow("SELECT status, attempt, error FROM jobs WHERE id = $1", job["id"])
        return row if row["error"] and "lease" in row["error"]["message"] else None
    row = await wait_until(expired, 120, "the lease's expiry recorded")
    assert row["error"] and "expired" in row["error"]["message"], dict(row)
    # The hypervisor answers again: the job (re)claimed by the same executor finishes, once.
    await sim._req("DELETE", "/faults")
    done = await stack.wait_job(job["id"], timeout_s=30)
    assert done["status"] == "succeeded", done
    assert len(await sim.vms_tagged(identity_tag(server["id"]))) == 1
    assert job["id"] not in stack.services["executor"].inflight
