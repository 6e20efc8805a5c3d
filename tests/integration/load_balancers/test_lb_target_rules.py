"""What a load balancer's ``ip`` target may reach: public unicast addresses outside every address
pool and platform network of the region, the tenant's own addresses, and private ranges only
where the region opens them (422 naming the rule); checked again at every configure, so a target
whose address changed hands is dropped from the config and shown ``refused`` in health; no load
balancer targets a load balancer; and a load balancer's size is bounded (targets × services,
checks per second per appliance)."""
from __future__ import annotations

import ipaddress
from types import SimpleNamespace
from typing import Any, AsyncIterator

import asyncpg
import pytest

from z9.resources.load_balancer import ip_target_refusal
from z9.resources.load_balancer.jobs import shared as lb_jobs
from z9.common.settings import AddressPoolSettings, Settings

from tests.support import REGION, SimAdmin, Stack, api_stack, make_tenant, wait_until
from tests.integration.load_balancers.test_load_balancers import SERVICE, _appliances, _get, _lb, lb_template  # noqa: F401
from z9.resources.address import store as address_store

AGENT_NET = "10.1.0.0/24"          # the region agent's network (the simulator's platform VMs)
PUBLIC_PLATFORM = "192.0.2.0/28"   # a platform network of public addresses (management, storage)
TENANT_NET = "10.200.0.0/16"       # a private network the region opens to load balancer targets


def _region(settings: Settings) -> Settings:
    region = settings.regions[REGION].model_copy(update={
        "platform_networks": [ipaddress.ip_network(AGENT_NET), ipaddress.ip_network(PUBLIC_PLATFORM)],
        "lb_target_private_networks": [ipaddress.ip_network(TENANT_NET)]})
    return settings.model_copy(update={"regions": {REGION: region}})


@pytest.fixture
async def walled(settings: Settings, pool: asyncpg.Pool) -> AsyncIterator[Stack]:
    async with api_stack(_region(settings), pool) as stack:
        yield stack


def test_the_rules_in_order() -> None:
    nets = {"platform_networks": [ipaddress.ip_network(AGENT_NET)],
            "pool_networks": [ipaddress.ip_network("203.0.113.0/24")],
            "private_allowed": [ipaddress.ip_network("10.1.0.0/16")]}
    mine, lb, theirs = {"tenant_id": "a", "kind": "floating"}, {"tenant_id": "a", "kind": "load_balancer"}, \
        {"tenant_id": "b", "kind": "primary"}
    cases = [("10.1.0.2", None, "platform_network"),          # even inside an allowed private network
             ("10.1.0.2", mine, "platform_network"),
             ("203.0.113.20", theirs, "another_tenant"), ("203.0.113.20", lb, "load_balancer_address"),
             ("203.0.113.20", mine, None), ("203.0.113.1", None, "address_pool"),
             ("10.1.5.5", None, None), ("10.2.0.1", None, "private_range"), ("172.16.0.1", None, "private_range"),
             ("192.168.1.1", None, "private_range"), ("100.64.0.1", None, "private_range"),
             ("198.18.0.1", None, "private_range"), ("8.8.8.8", None, None), ("198.51.100.7", None, None)]
    for ip, holder, rule in cases:
        assert ip_target_refusal(ip, "a", holder, **nets) == rule, (ip, holder)
    # one IP held in two regions (their ranges overlap): the other tenant's holding decides
    assert ip_target_refusal("203.0.113.20", "a", [mine, theirs], **nets) == "another_tenant"
    assert ip_target_refusal("203.0.113.20", "a", [mine, lb], **nets) == "load_balancer_address"
    assert ip_target_refusal("203.0.113.20", "a", [mine, mine], **nets) is None


async def test_private_and_platform_targets_are_refused_naming_the_rule(walled: Stack) -> None:
    api = walled
    lb, _ = await _lb(api, name="walls", services=[SERVICE])
    base = f"/load-balancers/{lb['id']}/actions/add_target"
    refused = {"10.1.0.2": "platform_network",            # the region agent
               "192.0.2.5": "platform_network",            # a public platform network
               "10.0.0.7": "private_range", "172.20.1.1": "private_range", "192.168.0.10": "private_range",
               "100.64.3.3": "private_range",
               "203.0.113.1": "address_pool",              # the pool's gateway
               "203.0.113.200": "address_pool",            # a free IP of the pool
               lb["public_net"]["ipv4"]["ip"]: None}       # its own VIP (the older rule, same 422)
    for ip, rule in refused.items():
        status, out = await api.call("POST", base, json={"type": "ip", "ip": ip})
        assert status == 422 and out["error"]["details"][0]["field"] == "ip", (ip, out)
        if rule:
            assert out["error"]["details"][0]["rule"] == rule and rule in out["error"]["message"], (ip, out)
        status, out = await api.call("POST", "/load-balancers", json={
            "region": REGION, "name": "w2", "services": [SERVICE], "targets": [{"type": "ip", "ip": ip}]})
        assert status == 422, (ip, out)
    for ip in ("10.200.1.1", "198.51.100.9", "8.8.4.4"):       # opened private network; public hosts
        status, out = await api.call("POST", base, json={"type": "ip", "ip": ip})
        assert status == 202, (ip, out)


async def test_no_load_balancer_targets_a_load_balancer(walled: Stack) -> None:
    """Not another tenant's, not the tenant's own (so no two can loop), VIP or appliance address."""
    api = walled
    a, _ = await _lb(api, name="a", type="lb-ha", services=[SERVICE])
    b, _ = await _lb(api, name="b", services=[SERVICE])
    for ip in (b["public_net"]["ipv4"]["ip"], b["members"][0]["ip"]):
        status, out = await api.call("POST", f"/load-balancers/{a['id']}/actions/add_target",
                                     json={"type": "ip", "ip": ip})
        assert status == 422 and out["error"]["details"][0]["rule"] == "load_balancer_address", out
    status, out = await api.call("POST", f"/load-balancers/{b['id']}/actions/add_target",
                                 json={"type": "ip", "ip": a["public_net"]["ipv4"]["ip"]})
    assert status == 422 and out["error"]["details"][0]["rule"] == "load_balancer_address", out
    _, other = await make_tenant(api.pool, "other")
    status, out = await api.call("POST", "/load-balancers", token=other, json={
        "region": REGION, "name": "c", "services": [SERVICE], "targets": [{"type": "ip", "ip": a["members"][1]["ip"]}]})
    assert status == 422 and out["error"]["details"][0]["rule"] == "another_tenant", out
    # the tenant's own floating address is fine
    status, out = await api.call("POST", "/addresses", json={"region": REGION, "name": "mine"})
    assert status == 202, out
    status, out = await api.call("POST", f"/load-balancers/{b['id']}/actions/add_target",
                                 json={"type": "ip", "ip": out["address"]["ip"]})
    assert status == 202, out


@pytest.fixture
async def small(settings: Settings, pool: asyncpg.Pool) -> AsyncIterator[Stack]:
    async with api_stack(settings.model_copy(update={"lb_max_target_services": 10, "lb_max_checks_per_s": 2.0}),
                         pool) as stack:
        yield stack


async def test_a_load_balancers_size_is_bounded(small: Stack) -> None:
    api = small
    slow = {**SERVICE, "health_check": {**SERVICE["health_check"], "interval_s": 10}}
    targets = [{"type": "ip", "ip": f"198.51.100.{i}"} for i in range(1, 6)]
    # 5 targets × 3 services = 15 > 10
    status, out = await api.call("POST", "/load-balancers", json={
        "region": REGION, "name": "big", "targets": targets,
        "services": [{**slow, "listen_port": p} for p in (80, 81, 82)]})
    assert status == 409 and out["error"]["code"] == "resource_limit_exceeded", out
    assert "Z9_LB_MAX_TARGET_SERVICES" in out["error"]["message"], out
    # 5 × 2 = 10 at one check per 10 s: 1 check/s; then a third service is one too many
    lb, _ = await _lb(api, name="ok", targets=targets, services=[{**slow, "listen_port": p} for p in (80, 81)])
    status, out = await api.call("POST", f"/load-balancers/{lb['id']}/actions/add_service", json={**slow, "listen_port": 82})
    assert status == 409 and out["error"]["details"][0]["limit"] == "lb_max_target_services", out
    # checks every 3 s: 10 / 3 = 3.3 checks/s > 2
    status, out = await api.call("POST", f"/load-balancers/{lb['id']}/actions/update_service",
                                 json={"listen_port": 80, "health_check": {"interval_s": 3, "timeout_s": 2}})
    assert status == 409 and out["error"]["details"][0]["limit"] == "lb_max_checks_per_s", out
    assert "Z9_LB_MAX_CHECKS_PER_S" in out["error"]["message"], out
    status, out = await api.call("POST", f"/load-balancers/{lb['id']}/actions/add_target",
                                 json={"type": "ip", "ip": "198.51.100.77"})
    assert status == 409 and out["error"]["code"] == "resource_limit_exceeded", out
    # nothing of the refused actions was kept
    cur = await _get(api, lb["id"])
    assert len(cur["targets"]) == 5 and [s["health_check"]["interval_s"] for s in cur["services"]] == [10, 10]


async def test_a_target_whose_address_changed_tenant_is_dropped_at_the_next_configure(
        stack: Stack, sim: SimAdmin) -> None:
    """Tenant B's ip target is B's own address (allowed); B lets it go, and the pool hands it to
    tenant A: the next configure (here the periodic observe's drift repair) renders it out of the
    config, and its health says refused: another_tenant."""
    status, out = await stack.call("POST", "/addresses", json={"region": REGION, "name": "handed-over"})
    assert status == 202, out
    address = out["address"]
    lb, job = await _lb(stack, name="hand", services=[SERVICE], targets=[{"type": "ip", "ip": address["ip"]}])
    assert (await stack.wait_job(job["id"], timeout_s=120))["status"] == "succeeded"
    vm = _appliances(await sim.state(), lb["id"])[0]

    async def config() -> str:
        return (await sim._req("GET", f"/guests/{vm['vmid']}"))["models"]["appliance"]["haproxy"]
    assert f"{address['ip']}:8080" in await config()
    # the address goes (released to the pool, its quarantine over) and tenant A gets the same IP
    other, _ = await make_tenant(stack.pool, "tenant-a")
    async with stack.pool.acquire() as conn, conn.transaction():
        await conn.execute("UPDATE addresses SET status = 'deleted', deleted_at = now() WHERE id = $1", address["id"])
        await address_store.address_release(conn, address["id"])
        await conn.execute("UPDATE address_pool_ips SET reusable_after = now() - interval '1 s' WHERE ip = $1::inet",
                           address["ip"])
        [pool_row] = await address_store.address_pool_list(conn, REGION)
        theirs = await address_store.address_allocate(conn, pool_id=pool_row["id"], tenant_id=other, kind="floating")
    assert theirs is not None and theirs.ip_text == address["ip"]

    async def dropped() -> dict | None:
        cur = await _get(stack, lb["id"])
        [t] = cur["targets"]
        return cur if t["health_status"][0]["status"] == "refused" and f"{address['ip']}:" not in await config() \
            else None
    cur = await wait_until(dropped, stack.settings.lb_health_interval_s * 3 + 60, "the target dropped")
    assert cur["targets"][0]["health_status"][0]["reason"] == "another_tenant", cur
    assert cur["status"] == "active" and cur["health"] == "unknown", cur   # nothing left to balance to


# a second region: its own public pool and a public platform network (so that, but for the rules
# of every region, its addresses would pass as public hosts)
REGION_2 = "dev-2"
POOL_2 = "192.0.2.128/25"
PLATFORM_2 = "198.51.100.240/28"


def _two_regions(settings: Settings) -> Settings:
    one = _region(settings).regions[REGION]
    two = one.model_copy(update={
        "address_pools": [AddressPoolSettings(name="public", cidr=POOL_2, gateway="192.0.2.129")],
        "platform_networks": [ipaddress.ip_network(PLATFORM_2)], "lb_target_private_networks": []})
    return settings.model_copy(update={"regions": {REGION: one, REGION_2: two}})


@pytest.fixture
async def two_regions(settings: Settings, pool: asyncpg.Pool) -> AsyncIterator[Stack]:
    async with api_stack(_two_regions(settings), pool) as stack:
        yield stack


async def test_the_rules_hold_across_regions(two_regions: Stack) -> None:
    """A dev-1 load balancer may not target another tenant's dev-2 VIP, a free dev-2 pool IP, a
    dev-2 platform network, nor its own tenant's dev-2 VIP (a loop across regions); its own dev-2
    floating address is fine."""
    api = two_regions
    lb, _ = await _lb(api, name="here", services=[SERVICE])
    _, other = await make_tenant(api.pool, "other-tenant")
    status, out = await api.call("POST", "/load-balancers", token=other, json={
        "region": REGION_2, "name": "theirs", "services": [SERVICE]})
    assert status == 202, out
    theirs = out["load_balancer"]["public_net"]["ipv4"]["ip"]
    mine_there, _ = await _lb(api, region=REGION_2, name="mine-there", services=[SERVICE])
    base = f"/load-balancers/{lb['id']}/actions/add_target"
    refused = {theirs: "another_tenant",
               mine_there["public_net"]["ipv4"]["ip"]: "load_balancer_address",
               "192.0.2.200": "address_pool",          # a free IP of dev-2's pool
               "198.51.100.241": "platform_network"}   # dev-2's platform network
    for ip, rule in refused.items():
        status, out = await api.call("POST", base, json={"type": "ip", "ip": ip})
        assert status == 422 and out["error"]["details"][0]["rule"] == rule, (ip, out)
    status, out = await api.call("POST", "/addresses", json={"region": REGION_2, "name": "mine"})
    assert status == 202, out
    status, out = await api.call("POST", base, json={"type": "ip", "ip": out["address"]["ip"]})
    assert status == 202, out


async def test_every_configure_checks_the_rules_of_every_region(two_regions: Stack) -> None:
    """The executor's re-check (at every configure): a dev-1 load balancer's target is its
    tenant's own dev-2 address; once dev-2 hands that IP to another tenant, the configure's view
    of the targets refuses it (another_tenant)."""
    api = two_regions
    status, out = await api.call("POST", "/addresses", json={"region": REGION_2, "name": "handed-over"})
    assert status == 202, out
    address = out["address"]
    lb, _ = await _lb(api, name="hand", services=[SERVICE], targets=[{"type": "ip", "ip": address["ip"]}])
    ctx = SimpleNamespace(pool=api.pool, settings=api.settings, job=SimpleNamespace(resource_id=lb["id"]))
    _, [target] = await lb_jobs.load(ctx)  # type: ignore[arg-type]
    assert target["refused"] is None and target["addr"] == address["ip"], target
    other, _ = await make_tenant(api.pool, "tenant-a")
    async with api.pool.acquire() as conn, conn.transaction():
        await conn.execute("UPDATE addresses SET status = 'deleted', deleted_at = now() WHERE id = $1", address["id"])
        await address_store.address_release(conn, address["id"])
        await conn.execute("UPDATE address_pool_ips SET reusable_after = now() - interval '1 s' WHERE ip = $1::inet",
                           address["ip"])
        [pool_row] = await address_store.address_pool_list(conn, REGION_2)
        got = await address_store.address_allocate(conn, pool_id=pool_row["id"], tenant_id=other, kind="floating")
    assert got is not None and got.ip_text == address["ip"]
    _, [target] = await lb_jobs.load(ctx)  # type: ignore[arg-type]
    assert target["refused"] == "another_tenant" and target["addr"] is None, target
