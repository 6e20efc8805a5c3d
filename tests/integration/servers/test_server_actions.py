"""Issue 12 §3 and tests 3-4: power actions, resize and rename go through jobs and are
idempotent (each run twice: the second plans nothing); quotas hold under concurrency."""
from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import datetime, timezone

from z9.common import kinds, store
from z9.common.models import Job
from z9.resources.server.jobs import reboot as server_reboot
from z9.executor.proxmox import VmState

from tests.support import SimAdmin, Stack
from z9.resources.server import SERVER_REBOOT


async def _created(stack: Stack, name: str = "web-1") -> dict:
    server, job = await stack.create_server(name)
    done = await stack.wait_job(job["id"])
    assert done["status"] == "succeeded", done
    return await stack.server(server["id"])


async def _rerun(stack: Stack, job_id: str) -> dict:
    """The same kind, args and resource, as a new job (an operator re-running it)."""
    old = await store.job_get(stack.pool, job_id)
    async with stack.pool.acquire() as conn, conn.transaction():
        new = await store.job_insert(conn, store.NewJob(
            kind=old.kind, region=old.region, tenant_id=old.tenant_id, resource_type=old.resource_type,
            resource_id=old.resource_id, args=old.args))
    return await stack.wait_job(new.id)


async def _act(stack: Stack, sid: str, action: str, expect: int = 202, **kw) -> dict:
    status, out = await stack.call("POST", f"/servers/{sid}/actions/{action}", **kw)
    assert status == expect, out
    return out


async def _done(stack: Stack, out: dict) -> dict:
    job = await stack.wait_job(out["job"]["id"])
    assert job["status"] == "succeeded", job
    return job


async def test_power_actions_are_jobs_and_idempotent(stack: Stack, sim: SimAdmin) -> None:
    server = await _created(stack)
    sid, vmid = server["id"], server["observed"]["vmid"]

    job = await _done(stack, await _act(stack, sid, "shutdown"))
    assert [s["name"] for s in job["steps"]] == ["shutdown"]
    assert not (await sim.vm(vmid))["running"]
    got = await stack.server(sid)
    assert got["status"] == "stopped" and got["observed"]["power_state"] == "stopped"
    again = await _rerun(stack, job["id"])
    assert again["status"] == "succeeded" and again["steps"] == []

    job = await _done(stack, await _act(stack, sid, "start"))
    assert [s["name"] for s in job["steps"]] == ["start"]
    assert (await sim.vm(vmid))["running"] and (await stack.server(sid))["status"] == "running"
    assert (await _rerun(stack, job["id"]))["steps"] == []

    job = await _done(stack, await _act(stack, sid, "poweroff"))
    assert [s["name"] for s in job["steps"]] == ["poweroff"]
    assert job["steps"][0]["detail"]["upid"].split(":")[5] == "qmstop"
    assert not (await sim.vm(vmid))["running"] and (await stack.server(sid))["status"] == "stopped"
    assert (await _rerun(stack, job["id"]))["steps"] == []

    # reboot of a stopped server starts it (the outcome asked for: a VM booted after the request)
    job = await _done(stack, await _act(stack, sid, "reboot"))
    assert [s["name"] for s in job["steps"]] == ["start"]
    assert (await sim.vm(vmid))["running"]
    await asyncio.sleep(1.1)  # uptime has a resolution of one second
    job = await _done(stack, await _act(stack, sid, "reboot"))
    assert [s["name"] for s in job["steps"]] == ["reboot"]
    assert job["steps"][0]["detail"]["upid"].split(":")[5] == "qmreboot"
    assert (await stack.server(sid))["status"] == "running"


def _job(created_ago_s: float, **args) -> Job:
    from datetime import timedelta
    now = datetime.now(timezone.utc)
    return Job(id="job_x", seq=1, kind=SERVER_REBOOT, region="r", tenant_id=None, resource_type="server",
               resource_id="srv_01jd3x5v8q2m6n4p7r9s1t3w5y", args=args, status="running", attempt=1,
               max_attempts=3, run_after=now, lease_owner=None, lease_expires_at=None, steps=[], memo={},
               error=None, trace_context=None, created_at=now - timedelta(seconds=created_ago_s), started_at=now,
               finished_at=None, updated_at=now)


def test_reboot_plan_is_idempotent_by_the_request_time() -> None:
    """A reboot re-run (same job) after the VM booted since the request plans nothing."""
    tags = frozenset({"z9-id-srv_01jd3x5v8q2m6n4p7r9s1t3w5y", "z9-member-main", "z9-role-customer"})
    vm = VmState(vmid=101, node="pve1", config={}, status="running", tags=tags, uptime_s=3)
    job = _job(10)
    assert server_reboot.plan(job, server_reboot.World(vm=vm, requested_ago_s=10.0)) == []
    steps = server_reboot.plan(job, server_reboot.World(vm=replace(vm, uptime_s=500), requested_ago_s=10.0))
    assert [s.name for s in steps] == ["reboot"]
    steps = server_reboot.plan(job, server_reboot.World(vm=replace(vm, status="stopped", uptime_s=0),
                                                        requested_ago_s=10.0))
    assert [s.name for s in steps] == ["start"]


async def test_resize_and_rename(stack: Stack, sim: SimAdmin) -> None:
    server = await _created(stack)
    sid, vmid = server["id"], server["observed"]["vmid"]
    # cores/memory on a running server: Proxmox would only make it a pending change
    out = await _act(stack, sid, "resize", 409, json={"cores": 4})
    assert out["error"]["code"] == "server_not_stopped"
    out = await _act(stack, sid, "resize", 422, json={"disk_gib": 5})
    assert "shrink" in out["error"]["message"]
    out = await _act(stack, sid, "resize", 422, json={})
    # the disk grows online
    job = await _done(stack, await _act(stack, sid, "resize", json={"disk_gib": 20}))
    assert [s["name"] for s in job["steps"]] == ["resize_disk"]
    assert "size=20G" in (await sim.vm(vmid))["config"]["scsi0"]
    assert (await sim.vm(vmid))["running"]
    assert (await _rerun(stack, job["id"]))["steps"] == []
    await _done(stack, await _act(stack, sid, "shutdown"))
    job = await _done(stack, await _act(stack, sid, "resize", json={"cores": 4, "memory_mib": 4096}))
    assert [s["name"] for s in job["steps"]] == ["configure"]
    cfg = (await sim.vm(vmid))["config"]
    assert str(cfg["cores"]) == "4" and str(cfg["memory"]) == "4096"
    assert (await _rerun(stack, job["id"]))["steps"] == []
    got = await stack.server(sid)
    assert (got["cores"], got["memory_mib"], got["disk_gib"]) == (4, 4096, 20)

    # rename and labels: database only
    status, out = await stack.call("PATCH", f"/servers/{sid}", json={"name": "web-2", "labels": {"env": "prod"}})
    assert status == 200 and out["server"]["name"] == "web-2" and out["server"]["labels"] == {"env": "prod"}
    await stack.create_server("web-3")
    status, out = await stack.call("PATCH", f"/servers/{sid}", json={"name": "web-3"})
    assert status == 409 and "web-3" in out["error"]["message"]
    status, out = await stack.call("PATCH", f"/servers/{sid}", json={"labels": {"-bad": "x"}})
    assert status == 422 and "labels" in out["error"]["message"]


async def test_20_concurrent_creates_against_a_quota_of_10(api: Stack) -> None:
    await store.tenant_quota_set(api.pool, api.tenant_id, {"servers": 10})

    async def one(i: int) -> tuple[int, dict]:
        body = {"name": f"q-{i}", "region": "dev-1", "image": "debian-12", "cores": 1, "memory_mib": 1024,
                "disk_gib": 10}
        return await api.call("POST", "/servers", json=body)

    answers = await asyncio.gather(*(one(i) for i in range(20)))
    assert sorted(s for s, _ in answers) == [202] * 10 + [403] * 10, answers
    refused = [b for s, b in answers if s == 403]
    assert all(b["error"]["code"] == "quota_exceeded" for b in refused)
    assert refused[0]["error"]["details"] == [{"limit": "servers", "quota": 10, "used": 10, "requested": 1}]
    assert await api.pool.fetchval("SELECT count(*) FROM servers WHERE tenant_id = $1", api.tenant_id) == 10
    # cores: a default from the settings, the tenant's own override wins
    await store.tenant_quota_set(api.pool, api.tenant_id, {"servers": None, "cores": 11})
    status, out = await api.call("POST", "/servers", json={"name": "big", "region": "dev-1", "image": "debian-12",
                                                            "cores": 2, "memory_mib": 1024, "disk_gib": 10})
    assert status == 403 and out["error"]["details"][0]["limit"] == "cores" and out["error"]["details"][0]["used"] == 10


async def test_operator_sets_a_tenants_quota_with_z9_quota(api: Stack) -> None:
    import os
    import subprocess
    import sys

    from tests.support import make_tenant, service_env

    _, token = await make_tenant(api.pool, "quota-cli")
    z9 = os.path.join(os.path.dirname(sys.executable), "z9")
    env = service_env(api.settings, QUOTA_ADDRESSES="5")

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([z9, "quota", "--tenant", "quota-cli", *args], env=env, capture_output=True, text=True,
                              timeout=60)

    out = run("--servers", "1", "--memory-mib", "4096")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    rows = {line.split()[0]: line.split()[1:] for line in lines[1:]}
    # one column each: every row's fields start where the header's do (the longest unit name fits)
    assert len({line.index(line.split()[1]) + len(line.split()[1]) for line in lines}) == 1, out.stdout
    assert rows["servers"] == ["1", "tenant", "0"] and rows["addresses"] == ["5", "default", "0"]
    assert rows["cores"] == ["none", "default", "0"]
    body = {"name": "one", "region": "dev-1", "image": "debian-12", "cores": 1, "memory_mib": 1024, "disk_gib": 10}
    assert (await api.call("POST", "/servers", token=token, json=body))[0] == 202
    status, out2 = await api.call("POST", "/servers", token=token, json={**body, "name": "two"})
    assert status == 403 and out2["error"]["code"] == "quota_exceeded"
    assert "servers" in out2["error"]["message"] and "uses 1" in out2["error"]["message"]
    out = run("--servers", "default")
    assert out.returncode == 0 and "servers" in out.stdout
    assert (await api.call("POST", "/servers", token=token, json={**body, "name": "two"}))[0] == 202
    assert run("--servers", "-3").returncode == 2
    # the engine's cap on running jobs per region (not a resource quota: nothing is refused by it)
    assert rows["running_jobs"][:2] == ["none", "default"]
    out = run("--running-jobs", "3")
    assert out.returncode == 0, out.stderr
    assert [line.split()[1:3] for line in out.stdout.splitlines() if line.startswith("running_jobs")] == [["3", "tenant"]]
    assert await api.pool.fetchval("SELECT quota FROM tenant_quota_limits l JOIN tenants t ON t.id = l.tenant_id "
                                   "WHERE t.name = 'quota-cli' AND l.unit = 'running_jobs'") == 3
    assert "running_jobs" not in (await api.call("GET", "/quota", token=token))[1]["quotas"]


async def test_a_failed_reboot_then_a_verified_start_leaves_the_server_running_and_resizable(
        stack: Stack, sim: SimAdmin) -> None:
    """Status from the latest verify: a reboot Proxmox refuses for good (403) fails its job and
    marks the server failed with the reason; a later start whose verify reads the VM running
    makes it ``running`` again (the reason gone from the server, kept on the failed job), and a
    resize is then accepted — a stop, a start and a resize all succeed."""
    server = await _created(stack)
    sid = server["id"]
    # (stopped first: the reboot of a stopped VM is a start, whatever the VM's uptime — a reboot asked
    # for within a second of the boot reads as done, uptime having whole seconds)
    await _done(stack, await _act(stack, sid, "shutdown"))
    await sim.fault(method="POST", path=r"/status/start$", action="error", status=403,
                    reason="Permission check failed (/vms/100, VM.PowerMgmt)", times=1)
    failed = await stack.wait_job((await _act(stack, sid, "reboot"))["job"]["id"])
    assert failed["status"] == "failed" and "VM.PowerMgmt" in failed["error"]["message"], failed
    got = await stack.server(sid)
    assert got["status"] == "failed" and "VM.PowerMgmt" in got["status_reason"], got

    await _done(stack, await _act(stack, sid, "start"))  # the VM runs: nothing to do, verify reads it
    got = await stack.server(sid)
    assert got["status"] == "running" and got["status_reason"] is None, got
    assert (await stack.job(failed["id"]))["error"]["message"] == failed["error"]["message"]
    await _done(stack, await _act(stack, sid, "shutdown"))
    await _done(stack, await _act(stack, sid, "resize", json={"cores": 4}))
    await _done(stack, await _act(stack, sid, "start"))
    got = await stack.server(sid)
    assert (got["status"], got["cores"]) == ("running", 4), got
