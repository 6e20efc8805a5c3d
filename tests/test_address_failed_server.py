"""An address meant for a server whose create failed for good: its AddressAssign (ordered after
the create by the server's lock key) finds a failed server without a VM — nothing will ever
make one — and fails at once with a reason naming that, instead of spending every attempt on
a temporary "no VM yet" while the server's deletion waits behind it."""
from __future__ import annotations

import time

from tests.support import REGION, SimAdmin, Stack, wait_until
from tests.test_addresses_api import _get, _jobs_of


async def test_assign_to_a_server_whose_create_failed_fails_at_once(stack: Stack, sim: SimAdmin) -> None:
    stack.settings.max_attempts = 10
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
