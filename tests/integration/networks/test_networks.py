"""Private networks through the API, against real PostgreSQL and the Proxmox VE simulator over HTTPS:
the SDN VNet each network is (one batched apply for many creates), servers joining at their create
(two tenants with the same range never reach each other; a server on two networks reaches each peer
only on its network), the 409s (ip_not_available, no_subnet_available, resource_in_use), detach and
delete (the VNet gone after the apply). Assertions are on the world (the simulator's SDN, the VMs'
NICs, what its deliver model lets through) and on the rows."""
from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from tests.support import REGION, SimAdmin, Stack, make_tenant, wait_until

SDN = {"type": "vxlan", "peers": ["192.0.2.1", "192.0.2.2", "192.0.2.3"], "tags": [500, 599]}
pytestmark = pytest.mark.settings(region={"sdn": SDN}, sdn_apply_batch_s=0.5, sdn_reload_wait_s=3.0)


async def sdn_state(sim: SimAdmin) -> dict[str, Any]:
    return await sim._req("GET", "/sdn")


async def applies(sim: SimAdmin) -> int:
    return sum(1 for r in await sim.requests() if r["method"] == "PUT" and r["path"] == "/cluster/sdn")


async def lock_errors(sim: SimAdmin) -> int:
    return sum(1 for r in await sim.requests() if r["status"] >= 400 and "/cluster/sdn" in r["path"])


async def create_network(stack: Stack, name: str, ip_range: str = "10.0.0.0/24", token: str | None = None,
                         expect: int = 202) -> dict[str, Any]:
    status, out = await stack.call("POST", "/networks", json={"name": name, "region": REGION, "ip_range": ip_range},
                                   token=token)
    assert status == expect, out
    return out


async def succeeded(stack: Stack, out: dict[str, Any], timeout_s: float = 90) -> None:
    for j in [out["job"], *out.get("jobs", [])[1:]]:
        got = await stack.wait_job(j["id"], timeout_s=timeout_s)
        assert got["status"] == "succeeded", got


async def test_twenty_networks_created_at_once_take_at_most_two_applies(stack: Stack, sim: SimAdmin) -> None:
    outs = await asyncio.gather(*(create_network(stack, f"n{i}", "10.0.0.0/24") for i in range(20)))
    await asyncio.gather(*(succeeded(stack, o) for o in outs))
    assert await applies(sim) <= 2, await sim.requests()
    assert await lock_errors(sim) == 0
    st = await sdn_state(sim)
    vnets = {o["network"]["vnet"] for o in outs}
    assert len(vnets) == 20 and vnets <= set(st["running"]["vnets"])
    assert {v["tag"] for v in st["running"]["vnets"].values()} == set(range(500, 520)) or \
        len({v["tag"] for v in st["running"]["vnets"].values()}) == 20
    assert all(len(v) <= 8 for v in vnets)
    for o in outs:
        status, got = await stack.call("GET", f"/networks/{o['network']['id']}")
        assert got["network"]["status"] == "available", got
        assert got["network"]["observed"]["mtu"] == 1450
        assert set(got["network"]["observed"]["nodes"].values()) == {"available"}
    alias = {st["running"]["vnets"][o["network"]["vnet"]]["alias"] for o in outs}
    assert alias == {f"n{i}" for i in range(20)}  # the tenant's name is the VNet's alias


async def test_bad_ranges_and_a_region_without_sdn_are_refused(stack: Stack) -> None:
    for bad, why in (("8.8.8.0/24", "not private"), ("10.0.0.0/8", "/16 to /28"), ("10.0.0.1/24", "IPv4 network"),
                     ("10.0.0.0/30", "/16 to /28"), ("not-a-network", "IPv4 network")):
        status, out = await stack.call("POST", "/networks", json={"name": "x", "region": REGION, "ip_range": bad})
        assert status == 422 and out["error"]["details"][0]["field"] == "ip_range" and why in out["error"]["message"], out
