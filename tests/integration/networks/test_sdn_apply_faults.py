"""The region's SDN apply where peers break (pve-network ``SDN.pm``, ``API2/Network/SDN.pm``): pending
edits z9 did not make block it (named in the region's condition, neither applied nor rolled back); a
lock someone else holds is left alone and reported; a lock z9 recorded and could not release (its job
ended holding it) is released by the next job with that token only; a node whose reload fails keeps
the network's job in ``retry`` naming it until it recovers. Against real PostgreSQL and the simulator
over HTTPS."""
from __future__ import annotations

from typing import Any

import aiohttp
import pytest
from z9.common import metrics

from tests.support import REGION, Services, SimAdmin, Stack, wait_until

from .test_networks import SDN, applies, create_network, sdn_state, succeeded

pytestmark = pytest.mark.settings(region={"sdn": SDN}, sdn_apply_batch_s=0.3, sdn_reload_wait_s=1.0)


async def pve(stack: Stack, method: str, path: str, **data: Any) -> Any:
    """A call to the simulated PVE API as another client would make it (the region's token)."""
    r = stack.settings.regions[REGION]
    secret = r.token_secret.get_secret_value() if r.token_secret else ""
    async with aiohttp.ClientSession() as s:
        where = {"params": data} if method in ("GET", "DELETE") else {"data": data or None}
        async with s.request(method, f"{r.url}/api2/json{path}", ssl=False, **where,
                             headers={"Authorization": f"PVEAPIToken={r.token_id}={secret}"}) as resp:
            body = await resp.json()
            assert resp.status == 200, (resp.status, resp.reason, body)
            return body["data"]


async def condition(stack: Stack) -> dict[str, Any] | None:
    row = await stack.pool.fetchrow("SELECT condition FROM sdn_regions WHERE region = $1", REGION)
    return dict(row["condition"]) if row and row["condition"] else None


async def job(stack: Stack, job_id: str) -> dict[str, Any]:
    status, out = await stack.call("GET", f"/jobs/{job_id}")
    assert status == 200, out
    return out


async def test_foreign_pending_edits_block_the_apply_named_and_untouched(stack: Stack, sim: SimAdmin) -> None:
    await pve(stack, "POST", "/cluster/sdn/zones", zone="ops", type="vxlan", peers="192.0.2.9")
    await pve(stack, "POST", "/cluster/sdn/vnets", vnet="opsnet", zone="ops", tag=42)
    out = await create_network(stack, "blocked", "10.3.0.0/24")
    cond = await wait_until(lambda: condition(stack), 60, "the region's condition")
    assert cond["code"] == "foreign_sdn_edits", cond
    assert cond["objects"] == ["zone ops (new)", "vnet opsnet (new)"], cond
    # the operator's view and the metric say the same
    from z9.common import store as common_store

    op = "z9t_sdn-operator-token-0123456789abcdef"
    await common_store.api_token_insert(stack.pool, stack.tenant_id, op, "ops", scopes=["read", "write", "operator"])
    status, view = await stack.call("GET", "/operator/sdn", token=op)
    assert status == 200 and view["regions"][0]["condition"]["code"] == "foreign_sdn_edits", view
    assert metrics.SDN_APPLY_BLOCKED.labels(REGION, "foreign_sdn_edits")._value.get() == 1
    st = await sdn_state(sim)
    assert "opsnet" in st["vnets"] and "opsnet" not in st["running"]["vnets"]  # untouched: still pending
    assert st["lock"] is None and await applies(sim) == 0  # nothing applied, the lock given back
    assert (await job(stack, out["job"]["id"]))["status"] in ("pending", "retry", "running")
    # the operator applies their own edit (or rolls it back): z9's apply goes through
    await pve(stack, "DELETE", "/cluster/sdn/vnets/opsnet")
    await pve(stack, "DELETE", "/cluster/sdn/zones/ops")
    await succeeded(stack, out)
    assert await condition(stack) is None
    assert out["network"]["vnet"] in (await sdn_state(sim))["running"]["vnets"]
    assert metrics.SDN_APPLY_BLOCKED.labels(REGION, "foreign_sdn_edits")._value.get() == 0


async def test_a_foreign_lock_is_left_alone_and_reported(stack: Stack, sim: SimAdmin) -> None:
    token = await pve(stack, "POST", "/cluster/sdn/lock")
    out = await create_network(stack, "waits", "10.4.0.0/24")
    cond = await wait_until(lambda: condition(stack), 60, "the region's condition")
    assert cond["code"] == "sdn_locked" and "invalid lock token provided!" in cond["message"], cond
    assert (await sdn_state(sim))["lock"] == token  # never released by z9
    await pve(stack, "DELETE", "/cluster/sdn/lock", **{"lock-token": token})
    await succeeded(stack, out)
    row = await stack.pool.fetchrow("SELECT lock_token, condition FROM sdn_regions WHERE region = $1", REGION)
    assert row["lock_token"] is None and row["condition"] is None


async def test_a_lock_z9_recorded_and_lost_is_released_by_the_next_job_with_its_token(stack: Stack,
                                                                                       sim: SimAdmin) -> None:
    # the apply takes the lock (recorded), its first VNet write fails and so does the release: the job
    # ends holding the lock, as one whose executor died would — PVE's lock has no expiry
    await sim.fault(method="POST", path="^/cluster/sdn/vnets$", action="error", status=500,
                    reason="simulated failure", times=1)
    await sim.fault(method="DELETE", path="^/cluster/sdn/lock$", action="error", status=500,
                    reason="simulated failure", times=1)
    out = await create_network(stack, "relock", "10.5.0.0/24")

    async def recorded() -> str | None:
        row = await stack.pool.fetchrow("SELECT lock_token FROM sdn_regions WHERE region = $1", REGION)
        return row["lock_token"] if row else None

    token = await wait_until(recorded, 60, "a recorded lock token")
    await succeeded(stack, out)  # the next attempt released exactly that token, then applied
    log = [(r["method"], r["path"], r["status"]) for r in await sim.requests()]
    unlocks = [x for x in log if x[:2] == ("DELETE", "/cluster/sdn/lock")]
    assert unlocks[0][2] == 500 and unlocks[1][2] == 200, unlocks
    assert (await sdn_state(sim))["lock"] is None and token
    assert not [x for x in log if "/cluster/sdn" in x[1] and x[2] >= 400 and x[0] != "DELETE"
                and x[:2] != ("POST", "/cluster/sdn/vnets")], log


async def test_a_node_that_fails_its_reload_keeps_the_job_in_retry_naming_it(stack: Stack, sim: SimAdmin) -> None:
    await sim._req("POST", "/sdn/reload-fault", json={"node": "pve2", "fail": True})
    out = await create_network(stack, "reload", "10.6.0.0/24")

    async def retry_naming_pve2() -> dict[str, Any] | None:
        j = await job(stack, out["job"]["id"])
        err = (j.get("error") or {}).get("message", "")
        return j if j["status"] in ("retry", "pending", "running") and "pve2" in err else None

    j = await wait_until(retry_naming_pve2, 60, "the network's job in retry naming pve2")
    assert "pve2 (pending)" in j["error"]["message"], j
    async def only_pve2() -> dict[str, Any] | None:
        c = await condition(stack)
        return c if c and c["code"] == "node_reload_failed" and c["nodes"] == ["pve2"] else None

    cond = await wait_until(only_pve2, 60, "the region's condition naming pve2 alone")
    assert "pve2 (pending)" in cond["message"], cond
    await sim._req("POST", "/sdn/reload-fault", json={"node": "pve2", "fail": False})
    await succeeded(stack, out)
    _, got = await stack.call("GET", f"/networks/{out['network']['id']}")
    assert got["network"]["observed"]["nodes"] == {"pve1": "available", "pve2": "available", "pve3": "available"}


async def test_an_executor_sigkilled_holding_the_sdn_lock(api: Stack, sim: SimAdmin, services: Services) -> None:
    """The executor dies (SIGKILL) after taking PVE's SDN lock — recorded — and before its apply: PVE's
    lock has no expiry, every other SDN writer is refused. The next executor's attempt releases exactly
    the recorded token, then applies."""
    services.start("scheduler")
    first = services.start("executor")
    # the VNet write right after the lock is held up: the executor is killed during it
    await sim.fault(method="POST", path="^/cluster/sdn/vnets$", action="delay", seconds=6, times=1)
    out = await create_network(api, "killed", "10.7.0.0/24")

    async def recorded() -> str | None:
        row = await api.pool.fetchrow("SELECT lock_token FROM sdn_regions WHERE region = $1", REGION)
        return row["lock_token"] if row else None

    token = await wait_until(recorded, 60, "the SDN lock taken and recorded")
    assert (await sdn_state(sim))["lock"] == token
    await first.kill()
    assert (await sdn_state(sim))["lock"] == token  # held by no one alive, and no expiry
    services.start("executor")
    await succeeded(api, out)
    st = await sdn_state(sim)
    assert st["lock"] is None and out["network"]["vnet"] in st["running"]["vnets"]
    unlocks = [r for r in await sim.requests() if (r["method"], r["path"]) == ("DELETE", "/cluster/sdn/lock")]
    assert [r["status"] for r in unlocks] == [200], unlocks  # the recorded token, released once
    assert await recorded() is None
