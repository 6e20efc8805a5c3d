"""Issue 12 §3: cancel a pending or retrying job (it ends failed, error class cancelled; a
running one is refused, naming why), re-run a failed job's intent as a new job."""
from __future__ import annotations

from tests.support import Stack


async def test_cancel_pending_create_and_rerun_it(api: Stack) -> None:
    server, job = await api.create_server("c-1")
    status, out = await api.call("POST", f"/jobs/{job['id']}/actions/cancel")
    assert status == 200, out
    assert out["job"]["status"] == "failed" and out["job"]["error"]["class"] == "cancelled"
    assert "while pending" in out["job"]["error"]["message"]
    assert (await api.job(job["id"]))["status"] == "failed"
    # the server would otherwise stay `creating` for ever
    got = await api.server(server["id"])
    assert got["status"] == "failed" and "cancelled" in got["status_reason"]
    status, out = await api.call("POST", f"/jobs/{job['id']}/actions/cancel")  # again: the same answer
    assert status == 200 and out["job"]["error"]["class"] == "cancelled"

    status, out = await api.call("POST", f"/jobs/{job['id']}/actions/rerun", headers={"Idempotency-Key": "rr-1"})
    assert status == 202, out
    new = out["job"]
    assert new["id"] != job["id"] and new["kind"] == "ServerCreate" and new["status"] == "pending"
    assert new["resource"] == {"type": "server", "id": server["id"]}
    old_args = await api.pool.fetchval("SELECT args FROM jobs WHERE id = $1", job["id"])
    assert await api.pool.fetchval("SELECT args FROM jobs WHERE id = $1", new["id"]) == old_args
    # the same key replays the first answer: one new job, not two
    status, again = await api.call("POST", f"/jobs/{job['id']}/actions/rerun", headers={"Idempotency-Key": "rr-1"})
    assert status == 202 and again["job"]["id"] == new["id"]
    status, out = await api.call("POST", f"/jobs/{new['id']}/actions/rerun")
    assert status == 409 and out["error"]["code"] == "job_not_failed"
    await api.pool.execute("UPDATE jobs SET status = 'running', attempt = 1, lease_owner = 'x', "
                           "lease_expires_at = now() + interval '1 m' WHERE id = $1", new["id"])
    await api.pool.execute("UPDATE jobs SET status = 'succeeded', lease_owner = NULL, lease_expires_at = NULL, "
                           "finished_at = now() WHERE id = $1", new["id"])
    status, out = await api.call("POST", f"/jobs/{new['id']}/actions/cancel")
    assert status == 409 and out["error"]["code"] == "job_finished"


async def test_running_job_is_not_cancelled_and_retrying_one_is(api: Stack) -> None:
    server, job = await api.create_server("c-2")
    await api.pool.execute("UPDATE jobs SET status = 'running', attempt = 1, lease_owner = 'exec-x', "
                           "lease_expires_at = now() + interval '30 s', started_at = now() WHERE id = $1", job["id"])
    status, out = await api.call("POST", f"/jobs/{job['id']}/actions/cancel")
    assert status == 409 and out["error"]["code"] == "job_running"
    assert "running" in out["error"]["message"] and "hypervisor" in out["error"]["message"]
    assert (await api.job(job["id"]))["status"] == "running"
    await api.pool.execute("UPDATE jobs SET status = 'retry', lease_owner = NULL, lease_expires_at = NULL, "
                           "run_after = now() + interval '1 h', error = '{\"class\": \"temporary\", \"message\": \"x\"}' "
                           "WHERE id = $1", job["id"])
    # a retrying job of a server that is no longer creating: the server keeps its status
    await api.pool.execute("UPDATE servers SET status = 'running' WHERE id = $1", server["id"])
    status, out = await api.call("POST", f"/jobs/{job['id']}/actions/cancel")
    assert status == 200 and out["job"]["error"]["class"] == "cancelled" and "while retry" in out["job"]["error"]["message"]
    assert (await api.server(server["id"]))["status"] == "running"


async def test_deletion_jobs_are_not_rerun(api: Stack) -> None:
    server, _ = await api.create_server("c-3")
    status, out = await api.call("DELETE", f"/servers/{server['id']}")
    assert status == 202
    stop = out["job"]["id"]
    status, out = await api.call("POST", f"/jobs/{stop}/actions/cancel")
    assert status == 200  # the deletion goes on (a ServerStop during the buffer); its reason is kept
    assert (await api.server(server["id"]))["status"] == "deleting"
    status, out = await api.call("POST", f"/jobs/{stop}/actions/rerun")
    assert status == 409 and out["error"]["code"] == "job_not_rerunnable" and "delete the server again" in out["error"]["message"]
