"""An IPv6 floating address end to end (API, executor, simulator over HTTPS): allocated from a
v6 pool, assigned, moved, unassigned, deleted — its tag and IP-set entry on exactly one VM."""
from __future__ import annotations

from z9.common.settings import AddressPoolSettings

from tests.support import REGION, SimAdmin, Stack
from tests.integration.addresses.test_addresses_api import _address, _get, _on_vms, _server
from z9.resources.address import store as address_store


async def test_ipv6_floating_address_moves_and_goes(stack: Stack, sim: SimAdmin) -> None:
    stack.settings.regions[REGION].address_pools.append(
        AddressPoolSettings(name="public6", cidr="2001:db8:0:1::/120", gateway="2001:db8:0:1::1"))
    async with stack.pool.acquire() as conn:
        await address_store.address_pools_sync(conn, stack.settings.regions)
    a, b = await _server(stack, "v6a", public_ipv4=True), await _server(stack, "v6b", public_ipv4=True)  # filtered: listed
    adr = await _address(stack, family=6, server_id=a["id"])
    assert (adr["family"], adr["ip"], adr["prefix"], adr["pool"]) == (6, "2001:db8:0:1::2", 120, "public6")
    tag = f"z9-addr-{adr['id']}"
    va, vb = a["observed"]["vmid"], b["observed"]["vmid"]
    assert _on_vms(await sim.state(), tag, adr["ip"]) == ([va], [va])
    assert adr["status"] == "active" and adr["observed"]["holder"]["vmid"] == va

    status, out = await stack.call("POST", f"/addresses/{adr['id']}/actions/assign", json={"server_id": b["id"]})
    assert status == 202, out
    assert (await stack.wait_job(out["job"]["id"]))["status"] == "succeeded"
    assert _on_vms(await sim.state(), tag, adr["ip"]) == ([vb], [vb])

    status, out = await stack.call("POST", f"/addresses/{adr['id']}/actions/unassign")
    assert status == 202 and (await stack.wait_job(out["job"]["id"]))["status"] == "succeeded"
    assert _on_vms(await sim.state(), tag, adr["ip"]) == ([], [])
    got = await _get(stack, adr["id"])
    assert (got["status"], got["server_id"], got["observed"]["holder"]) == ("active", None, None)
