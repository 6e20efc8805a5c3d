"""Breaking issue 8 as a hostile API user (API alone, real PostgreSQL): addresses that belong to
another resource, allocation paths other than POST /v1/addresses, quotas, odd query values."""
from __future__ import annotations

import asyncio
from typing import Any

from tests.support import REGION, Stack
from z9.common import store
from z9.common.settings import AddressPoolSettings
from z9.resources.address import store as address_store


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
    renamed = {REGION: api.settings.regions[REGION].model_copy(update={"address_pools": [AddressPoolSettings(
        name="main", cidr="203.0.113.0/24", gateway="203.0.113.1", range=["203.0.113.10", "203.0.113.250"],
        reserved=["203.0.113.11"])]})}
    async with api.pool.acquire() as conn:   # the operator renames the pool (same network)
        await address_store.address_pools_sync(conn, renamed)
    # a row of a reserved IP stays while an address holds it (and is free again after its release)
    await api.pool.execute("INSERT INTO address_pool_ips (pool_id, ip) SELECT id, '203.0.113.11' FROM address_pools"
                           " WHERE name = 'main'")
    status, out = await _lb(api, "lb1", type="lb-ha")
    assert status == 202, out
    ips = _lb_ips(out["load_balancer"])
    assert ips == ["203.0.113.12", "203.0.113.13", "203.0.113.14"], ips


async def _finish_jobs(api: Stack) -> None:
    await api.pool.execute("UPDATE jobs SET status = 'succeeded', finished_at = now()"
                           " WHERE status IN ('pending', 'running', 'retry')")


async def test_another_resources_address_never_goes_on_a_server(api: Stack) -> None:
    """A load balancer's VIP and a cluster's control-plane endpoint are held by their owners'
    VMs. Naming one as a new server's ``public_ipv4`` answered 500 (the load balancer's table
    rule refused it) or made the cluster's endpoint the server's cloud-init address; assigning
    the endpoint to a server was accepted (its IP set and tag on a customer VM beside the
    cluster's kube-vip). Both are 409s naming the owner, and nothing is written."""
    status, out = await _lb(api, "lb1")
    assert status == 202, out
    vip, lb = out["load_balancer"]["public_net"]["ipv4"]["address_id"], out["load_balancer"]["id"]
    status, out = await api.call("POST", "/clusters", json={
        "region": REGION, "name": "k1", "version": "1.33",
        "control_plane": {"count": 1, "cores": 2, "memory_mib": 2048, "disk_gib": 20}})
    assert status == 202, out
    endpoint, cluster = out["cluster"]["endpoint"]["address_id"], out["cluster"]["id"]
    srv, _ = await api.create_server("s1")
    await _finish_jobs(api)
    await api.pool.execute("UPDATE servers SET status = 'running' WHERE id = $1", srv["id"])
    before = await api.pool.fetch("SELECT id, kind, server_id, status FROM addresses ORDER BY id")
    jobs = await api.pool.fetchval("SELECT count(*) FROM jobs")

    for adr, code, owner in ((vip, "load_balancer_address", lb), (endpoint, "cluster_endpoint", cluster)):
        status, body = await api.call("POST", "/servers", json={
            "name": "s2", "region": REGION, "image": "debian-12", "cores": 1, "memory_mib": 512, "disk_gib": 10,
            "public_ipv4": adr})
        assert status == 409 and body["error"]["code"] == code and owner in body["error"]["message"], body
        status, body = await api.call("POST", f"/addresses/{adr}/actions/assign", json={"server_id": srv["id"]})
        assert status == 409 and body["error"]["code"] == code, body
        status, body = await api.call("POST", "/addresses", json={"region": REGION, "server_id": srv["id"]})
        assert status == 202, body   # (an address of the tenant's own still goes on it)
        await _finish_jobs(api)
        await api.pool.execute("UPDATE addresses SET status = 'deleted', deleted_at = now(), server_id = NULL"
                               " WHERE id = $1", body["address"]["id"])
    after = await api.pool.fetch("SELECT id, kind, server_id, status FROM addresses"
                                 " WHERE status <> 'deleted' ORDER BY id")
    assert [dict(r) for r in after] == [dict(r) for r in before]
    assert await api.pool.fetchval("SELECT count(*) FROM jobs") == jobs + 2
    assert await api.pool.fetchval("SELECT count(*) FROM servers WHERE name = 's2'") == 0


async def test_a_nul_in_any_query_value_is_a_422_naming_it(api: Stack) -> None:
    """``GET /v1/<plural>?name=%00`` (every resource type) and ``GET /v1/addresses?region=%00``
    reached PostgreSQL, which refuses a NUL in text: 500. A NUL never matches anything stored."""
    for path in ("/servers?name=a%00", "/addresses?name=%00", "/addresses?region=dev-1%00",
                 "/load-balancers?name=%00x", "/clusters?name=%00", "/jobs?resource_id=%00",
                 "/servers?label_selector=a%3D%00", "/addresses?name=x&region=%00"):
        status, body = await api.call("GET", path)
        param = path.split("%00")[0].rsplit("?", 1)[-1].rsplit("&", 1)[-1].split("=")[0]
        assert status == 422 and param in body["error"]["message"], (path, status, body)
        assert body["error"]["details"] == [{"field": param, "message": "contains a NUL character"}], body
    status, body = await api.call("GET", "/servers?name=a")
    assert status == 200, body

    # An undeclared parameter is the request's first fault, whatever its value: 400 naming it (a
    # route without query parameters documents no 422 — schemathesis found GET /jobs/{id} answering it).
    status, body = await api.call("GET", "/jobs/job_01m8rqrw9gcgq8n36d3zgkf71r?x=%00&y=")
    assert status == 400 and body["error"]["code"] == "unknown_parameter", body
    status, body = await api.call("GET", "/servers?name=%00&bogus=1")
    assert status == 400 and body["error"]["code"] == "unknown_parameter", body

    # A filter given twice was read once (the first one): label_selector=env=dev&label_selector=env=prod
    # listed env=dev only. 400 naming it, like an unknown one (a misspelt filter never widens a listing).
    for path in ("/servers?label_selector=env%3Ddev&label_selector=env%3Dprod", "/jobs?resource_id=srv_a&resource_id=srv_b",
                 "/servers?limit=1&limit=2&name=a"):
        status, body = await api.call("GET", path)
        assert status == 400 and body["error"]["code"] == "repeated_parameter", (path, body)
        param = path.split("?")[1].split("=")[0]
        assert body["error"]["details"] == [{"field": param, "message": "given more than once"}], body


async def test_load_balancer_and_cluster_addresses_count_against_the_address_quota(api: Stack) -> None:
    """Z9_QUOTA_ADDRESSES (or the tenant's override) counts every live address of the tenant —
    a load balancer's VIP and appliance addresses and a cluster's endpoint among them — but only
    POST /v1/addresses and a server's public_ipv4 checked it: with a quota of 1, one lb-ha
    allocated 3 addresses, and clusters any number."""
    await store.tenant_quota_set(api.pool, api.tenant_id, {"addresses": 3})
    status, out = await _lb(api, "big", type="lb-ha")          # 3 addresses: exactly the quota
    assert status == 202, out
    for path, body in (("/load-balancers", {"region": REGION, "name": "small"}),
                       ("/clusters", {"region": REGION, "name": "k1", "version": "1.33",
                                      "control_plane": {"count": 1, "cores": 2, "memory_mib": 2048,
                                                        "disk_gib": 20}}),
                       ("/addresses", {"region": REGION})):
        status, out = await api.call("POST", path, json=body)
        assert status == 403 and out["error"]["code"] == "quota_exceeded", (path, out)
        assert out["error"]["details"][0]["limit"] == "addresses" and out["error"]["details"][0]["used"] == 3, out
    await store.tenant_quota_set(api.pool, api.tenant_id, {"addresses": 5})
    status, out = await _lb(api, "ha2", type="lb-ha")           # 3 more: over 5
    assert status == 403 and out["error"]["details"] == [{"limit": "addresses", "quota": 5, "used": 3,
                                                          "requested": 3}], out
    assert await api.pool.fetchval("SELECT count(*) FROM addresses") == 3
    assert await api.pool.fetchval("SELECT count(*) FROM load_balancers") == 1


async def test_rerun_of_an_address_job_a_later_request_replaced_is_refused(api: Stack) -> None:
    """A failed AddressAssign to server A, then the address assigned to B: re-running the old
    job was accepted, and it would move the address back onto A's VM while the address says B
    (and a later assign to B would "already be assigned"). Likewise an old AddressCreate (on no
    server) after a later assign. The re-run of a job that is still the address's intent stays possible."""
    a, _ = await api.create_server("ra")
    b, _ = await api.create_server("rb")
    await _finish_jobs(api)
    await api.pool.execute("UPDATE servers SET status = 'running'")
    status, out = await api.call("POST", "/addresses", json={"region": REGION, "server_id": a["id"]})
    adr, to_a = out["address"]["id"], out["job"]["id"]
    failed = {"class": "permanent", "message": "boom"}
    await api.pool.execute("UPDATE jobs SET status = 'failed', finished_at = now(), error = $2 WHERE id = $1",
                           to_a, failed)
    status, out = await api.call("POST", f"/addresses/{adr}/actions/assign", json={"server_id": b["id"]})
    assert status == 202, out
    to_b = out["job"]["id"]
    await api.pool.execute("UPDATE jobs SET status = 'failed', finished_at = now(), error = $2 WHERE id = $1",
                           to_b, failed)
    status, out = await api.call("POST", f"/jobs/{to_a}/actions/rerun")
    assert status == 409 and out["error"]["code"] == "job_superseded", out
    assert b["id"] in out["error"]["message"] and a["id"] in out["error"]["message"], out
    status, out = await api.call("POST", f"/jobs/{to_b}/actions/rerun")       # still the intent
    assert status == 202 and out["job"]["kind"] == "AddressAssign", out
    await _finish_jobs(api)

    status, out = await api.call("POST", "/addresses", json={"region": REGION})   # an AddressCreate, on no server
    other, made = out["address"]["id"], out["job"]["id"]
    await api.pool.execute("UPDATE jobs SET status = 'failed', finished_at = now(), error = $2 WHERE id = $1",
                           made, failed)
    status, out = await api.call("POST", f"/addresses/{other}/actions/assign", json={"server_id": a["id"]})
    assert status == 202, out
    await _finish_jobs(api)
    status, out = await api.call("POST", f"/jobs/{made}/actions/rerun")
    assert status == 409 and out["error"]["code"] == "job_superseded" and "no server" in out["error"]["message"], out
    jobs = await api.pool.fetchval("SELECT count(*) FROM jobs WHERE resource_id = $1", adr)
    assert jobs == 3


async def test_the_last_free_ip_held_by_an_allocation_that_rolls_back_is_not_exhausted(api: Stack) -> None:
    """Allocations take the lowest free row with SKIP LOCKED: a request that found the pool's
    only free IP held by another allocation in flight answered 409 pool_exhausted at once —
    even when that allocation then rolled back (its name was taken, a load balancer was short
    of its second address) and the IP stayed free. Reproduced: 5 of 10 rounds of 6 requests
    with a taken name beside one valid request refused the valid one. The allocation now waits
    (briefly) for the allocations in flight before it says the pool is exhausted."""
    small = {REGION: api.settings.regions[REGION].model_copy(update={"address_pools": [AddressPoolSettings(
        name="public", cidr="203.0.113.0/24", gateway="203.0.113.1", range=["203.0.113.10", "203.0.113.11"])]})}
    async with api.pool.acquire() as conn:
        await address_store.address_pools_sync(conn, small)
    status, out = await api.call("POST", "/addresses", json={"region": REGION})
    assert status == 202 and out["address"]["ip"] == "203.0.113.10", out
    pid = out["address"]["id"]
    pool_id = await api.pool.fetchval("SELECT pool_id FROM addresses WHERE id = $1", pid)

    async def held_then_rolled_back(hold_s: float, allocated: asyncio.Event) -> None:
        async with api.pool.acquire() as conn:
            tx = conn.transaction()
            await tx.start()
            got = await address_store.address_allocate(conn, pool_id=pool_id, tenant_id=api.tenant_id, kind="floating")
            assert got is not None and got.ip_text == "203.0.113.11"
            allocated.set()
            await asyncio.sleep(hold_s)
            await tx.rollback()

    for path, body, key in (("/addresses", {"region": REGION}, "address"),
                            ("/servers", {"name": "s1", "region": REGION, "image": "debian-12", "cores": 1,
                                          "memory_mib": 512, "disk_gib": 10, "public_ipv4": True}, "server")):
        allocated = asyncio.Event()
        holder = asyncio.create_task(held_then_rolled_back(0.3, allocated))
        await asyncio.wait_for(allocated.wait(), 20)  # the allocation in flight holds the last free IP
        status, out = await api.call("POST", path, json=body)
        await holder
        assert status == 202, (path, out)
        made = out[key]["id"] if key == "address" else out[key]["public_ipv4"]["id"]
        assert await api.pool.fetchval("SELECT host(ip) FROM addresses WHERE id = $1", made) == "203.0.113.11"
        if key == "address":   # free it again for the next round
            await api.pool.execute("UPDATE addresses SET status = 'deleted', deleted_at = now() WHERE id = $1", made)
            await api.pool.execute("UPDATE address_pool_ips SET address_id = NULL WHERE address_id = $1", made)
    # exhausted for real: still a prompt 409 naming the pool
    status, out = await api.call("POST", "/addresses", json={"region": REGION})
    assert status == 409 and out["error"]["code"] == "pool_exhausted", out


async def test_a_protected_primary_outlives_its_server(api: Stack) -> None:
    """``protection.delete`` keeps an address from being deleted (409 protected on DELETE), but
    a protected primary with auto_delete went with its server's final delete all the same: its
    IP back to the pool, the DNS pointing at it up for grabs after the quarantine. Protection
    wins: the address stays, unassigned (as a primary without auto_delete does)."""
    srv, _ = await api.create_server("p1", public_ipv4=True)
    pub = srv["public_ipv4"]["id"]
    status, out = await api.call("PATCH", f"/addresses/{pub}", json={"protection": {"delete": True}})
    assert status == 200 and out["address"]["auto_delete"] is True, out
    other, _ = await api.create_server("p2", public_ipv4=True)
    await _finish_jobs(api)
    await api.pool.execute("UPDATE servers SET status = 'deleted', deleted_at = now()")
    for s in (srv, other):   # (the server delete's finishing transaction)
        async with api.pool.acquire() as conn, conn.transaction():
            await address_store.addresses_release_for_server(conn, s["id"])
    kept = (await api.call("GET", f"/addresses/{pub}"))[1]["address"]
    assert kept["status"] == "creating" and kept["server_id"] is None, kept
    gone = (await api.call("GET", f"/addresses/{other['public_ipv4']['id']}"))[1]["address"]
    assert gone["status"] == "deleted", gone
    assert await api.pool.fetchval("SELECT count(*) FROM address_pool_ips WHERE address_id = $1", pub) == 1


async def test_an_address_never_observed_stays_readable_after_its_server_is_deleted(api: Stack) -> None:
    """A floating address assigned to a server whose jobs never verified it (the server's create
    failed, the AddressAssign with it: ``observed`` NULL): the server's final delete unassigned
    it and wrote ``observed = {"holder": null}``, which the response model refuses — every
    GET /v1/addresses/{id} and GET /v1/addresses answered 500 from then on."""
    srv, _ = await api.create_server("n1")
    status, out = await api.call("POST", "/addresses", json={"region": REGION, "server_id": srv["id"]})
    assert status == 202, out
    adr = out["address"]["id"]
    await api.pool.execute("UPDATE jobs SET status = 'failed', finished_at = now(), error = $1",
                           {"class": "permanent", "message": "boom"})
    await api.pool.execute("UPDATE servers SET status = 'deleted', deleted_at = now()")
    async with api.pool.acquire() as conn, conn.transaction():
        await address_store.addresses_release_for_server(conn, srv["id"])
    status, out = await api.call("GET", f"/addresses/{adr}")
    assert status == 200 and out["address"]["server_id"] is None and out["address"]["observed"] is None, out
    status, out = await api.call("GET", "/addresses")
    assert status == 200 and [a["id"] for a in out["addresses"]] == [adr], out


async def test_a_failed_stop_or_unassign_outside_a_deletion_can_be_re_run(api: Stack) -> None:
    """ServerStop and AddressUnassign are their types' deletion-buffer jobs, but also the
    shutdown/poweroff actions and actions/unassign. A failed one of those was refused as "part
    of a deletion; delete the server again instead" — a live server or address, no deletion in
    sight. Only while the resource is being deleted is such a job the deletion's."""
    srv, _ = await api.create_server("st1")
    status, out = await api.call("POST", "/addresses", json={"region": REGION, "server_id": srv["id"]})
    adr = out["address"]["id"]
    await _finish_jobs(api)
    await api.pool.execute("UPDATE servers SET status = 'running', power_state = 'running'")
    failed = {"class": "temporary", "message": "out of attempts"}
    status, out = await api.call("POST", f"/servers/{srv['id']}/actions/shutdown")
    assert status == 202, out
    stop = out["job"]["id"]
    status, out = await api.call("POST", f"/addresses/{adr}/actions/unassign")
    assert status == 202, out
    off = out["job"]["id"]
    await api.pool.execute("UPDATE jobs SET status = 'failed', finished_at = now(), error = $1"
                           " WHERE status = 'pending'", failed)
    for jid, kind in ((stop, "ServerStop"), (off, "AddressUnassign")):
        status, out = await api.call("POST", f"/jobs/{jid}/actions/rerun")
        assert status == 202 and out["job"]["kind"] == kind, out
    await _finish_jobs(api)
    # while the address is being deleted, its failed unassign is the deletion's: delete it again
    status, out = await api.call("DELETE", f"/addresses/{adr}")
    assert status == 202, out
    await api.pool.execute("UPDATE jobs SET status = 'failed', finished_at = now(), error = $1 WHERE id = $2",
                           failed, out["job"]["id"])
    status, out = await api.call("POST", f"/jobs/{out['job']['id']}/actions/rerun")
    assert status == 409 and out["error"]["code"] == "job_not_rerunnable", out
