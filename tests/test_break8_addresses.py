"""Breaking issue 8 as a hostile API user (API alone, real PostgreSQL): addresses that belong to
another resource, allocation paths other than POST /v1/addresses, quotas, odd query values."""
from __future__ import annotations

from typing import Any

from tests.support import REGION, Stack
from z9.common import store
from z9.common.settings import AddressPoolSettings


async def _lb(api: Stack, name: str, **body: Any) -> tuple[int, Any]:
    return await api.call("POST", "/load-balancers", json={"region": REGION, "name": name, **body})


def _lb_ips(lb: dict[str, Any]) -> list[str]:
    return [lb["public_net"]["ipv4"]["ip"], *(m["ip"] for m in lb["members"])]


async def test_load_balancer_addresses_skip_live_and_reserved_ips(api: Stack) -> None:
    """A load balancer's VIP and member addresses come from the same pool rows as any address:
    its allocation must skip an IP a live address of the region holds (a pool renamed in the
    settings keeps the old pool's addresses live) and the pool's reserved IPs. It did not: the
    insert hit addresses_ip_live and every POST /v1/load-balancers of the region answered 500."""
    status, out = await api.call("POST", "/addresses", json={"region": REGION})
    assert status == 202 and out["address"]["ip"] == "203.0.113.10", out
    api.settings.regions[REGION].address_pools = [AddressPoolSettings(
        name="main", cidr="203.0.113.0/24", gateway="203.0.113.1", range=["203.0.113.10", "203.0.113.250"],
        reserved=["203.0.113.11"])]
    async with api.pool.acquire() as conn:   # the operator renames the pool (same network)
        await store.address_pools_sync(conn, api.settings.regions)
    # a row of a reserved IP stays while an address holds it (and is free again after its release)
    await api.pool.execute("INSERT INTO address_pool_ips (pool_id, ip) SELECT id, '203.0.113.11' FROM address_pools"
                           " WHERE name = 'main'")
    status, out = await _lb(api, "lb1", type="lb-ha")
    assert status == 202, out
    ips = _lb_ips(out["load_balancer"])
    assert ips == ["203.0.113.12", "203.0.113.13", "203.0.113.14"], ips
