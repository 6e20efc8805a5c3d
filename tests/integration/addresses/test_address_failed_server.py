"""An address meant for a server whose create failed for good: its AddressAssign (ordered after
the create by the server's lock key) finds a failed server without a VM — nothing will ever
make one — and fails at once with a reason naming that, instead of spending every attempt on
a temporary "no VM yet" while the server's deletion waits behind it."""
from __future__ import annotations

import time

import pytest

from tests.support import REGION, SimAdmin, Stack, wait_until
from tests.integration.addresses.test_addresses_api import _get, _jobs_of


@pytest.mark.settings(max_attempts=10)
async def test_assign_to_a_server_whose_create_failed_fails_at_once(stack: Stack, sim: SimAdmin) -> None:
    sim.allow_rejections = True
    await sim.fault(method="POST", path=r"/clone$", action="error", status=400,
                    reason="Parameter verification failed.", times=1)
    server, job = await stack.create_server("doomed", public_ipv4=True)
    assert (await stack.wait_job(job["id"], timeout_s=60))["status"] == "failed"
    pub = server["public_ipv4"]["id"]
    t0 = time.monotonic()

    async def settled() -> list[dict] | None:
        jobs = await _jobs_of(stack, pub)
        return jobs if all(j["status"] in ("succeeded", "failed") for j in jobs) else None
    [assign] = await wait_until(settled, 30, "the primary's assign to end")
    assert assign["status"] == "failed" and assign["attempt"] == 1, assign
    assert "failed" in assign["error"]["message"] and server["id"] in assign["error"]["message"], assign
    assert time.monotonic() - t0 < 15
    a = await _get(stack, pub)
    assert a["status"] == "failed"

    # the server's deletion is not held up, and releases the primary
    status, out = await stack.call("DELETE", f"/servers/{server['id']}")
    assert status == 202, out
    assert (await stack.wait_job(out["job"]["id"], timeout_s=30))["status"] == "succeeded"
    await stack.pool.execute("UPDATE servers SET delete_after = now() WHERE id = $1", server["id"])

    async def gone() -> bool:
        return (await _get(stack, pub))["status"] == "deleted"
    await wait_until(gone, 30, "the primary to be released")


@pytest.mark.settings(max_attempts=10)
async def test_a_rerun_of_the_failed_create_reruns_its_addresss_assign(stack: Stack, sim: SimAdmin) -> None:
    """The create asked for a public address: its re-run re-runs the AddressAssign that failed for
    want of the VM (both in the answer's ``jobs``), so the server ends reachable at its address with
    the address assigned — not running with its address ``failed`` and no IP filter."""
    sim.allow_rejections = True
    await sim.fault(method="POST", path=r"/clone$", action="error", status=400,
                    reason="Parameter verification failed.", times=1)
    server, job = await stack.create_server("again", public_ipv4=True)
    assert (await stack.wait_job(job["id"], timeout_s=60))["status"] == "failed"
    pub = server["public_ipv4"]["id"]

    async def assign_failed() -> bool:
        return [j["status"] for j in await _jobs_of(stack, pub)] == ["failed"]
    await wait_until(assign_failed, 30, "the primary's assign to fail")
    status, out = await stack.call("POST", f"/jobs/{job['id']}/actions/rerun")
    assert status == 202, out
    assert [j["kind"] for j in out["jobs"]] == ["ServerCreate", "AddressAssign"] and out["jobs"][0] == out["job"], out
    for j in out["jobs"]:
        assert (await stack.wait_job(j["id"], timeout_s=90))["status"] == "succeeded", j
    a = await _get(stack, pub)
    assert a["status"] == "active" and a["server_id"] == server["id"], a
    assert (await stack.server(server["id"]))["status"] == "running"
    # a second re-run of the (now superseded) old create is refused as before: nothing more to do
    status, out = await stack.call("POST", f"/jobs/{out['jobs'][1]['id']}/actions/rerun")
    assert status == 409, out
