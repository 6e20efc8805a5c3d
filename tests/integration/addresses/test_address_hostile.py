"""Hostile input on every address route (API alone, real PostgreSQL): odd JSON, wrong types,
unknown fields, huge bodies, ids of other types and tenants — always a 4xx naming what is wrong,
never a 500, never a row or a job written by a refused request."""
from __future__ import annotations

import json
from typing import Any

from tests.support import REGION, Stack, make_tenant
from z9.common import store

ADR = "adr_01jd3x5v8q2m6n4p7r9s1t3w5y"
SRV = "srv_01jd3x5v8q2m6n4p7r9s1t3w5y"


async def _raw(api: Stack, method: str, path: str, data: Any, token: str | None = None) -> tuple[int, Any]:
    headers = {"Content-Type": "application/json"}
    async with api.http.request(method, api.base + path, data=data,
                                headers={**api.headers(token), **headers}) as r:
        text = await r.text()
        try:
            return r.status, json.loads(text)
        except ValueError:
            return r.status, text


async def _counts(api: Stack) -> tuple[int, int]:
    return (await api.pool.fetchval("SELECT count(*) FROM addresses"),
            await api.pool.fetchval("SELECT count(*) FROM jobs"))


async def test_hostile_bodies_and_ids_never_500(api: Stack) -> None:
    srv, _ = await api.create_server("h-1")
    status, out = await api.call("POST", "/addresses", json={"region": REGION, "name": "h"})
    assert status == 202, out
    adr = out["address"]["id"]
    _, other = await make_tenant(api.pool, "other")
    before = await _counts(api)
    bodies: list[Any] = [
        "", "null", "[]", "1", '"x"', "{", '{"region": ' + "[" * 5000 + "]" * 5000 + "}",
        json.dumps({"region": REGION, "x": 1}), json.dumps({"region": 1}), json.dumps({"region": None}),
        json.dumps({"region": REGION, "family": "4"}), json.dumps({"region": REGION, "family": 5}),
        json.dumps({"region": REGION, "family": True}), json.dumps({"region": REGION, "pool": "NOPE"}),
        json.dumps({"region": REGION, "pool": "nope"}), json.dumps({"region": "nowhere"}),
        json.dumps({"region": REGION, "server_id": ADR}), json.dumps({"region": REGION, "server_id": SRV}),
        json.dumps({"region": REGION, "server_id": 5}), json.dumps({"region": REGION, "name": "x" * 100000}),
        json.dumps({"region": REGION, "dns_ptr": "a..b"}), json.dumps({"region": REGION, "protection": True}),
        json.dumps({"region": REGION, "protection": {"delete": "yes"}}),
        json.dumps({"region": REGION, "protection": {"delete": True, "rebuild": True}}),
        json.dumps({"region": REGION, "family": 6}), json.dumps({"region": "x" * 64}),
        json.dumps({"region": REGION, "name": "\u0000"}), b"\xff\xfe\x00",
    ]
    for b in bodies:
        status, out = await _raw(api, "POST", "/addresses", b)
        assert 400 <= status < 500, (b[:80] if isinstance(b, (str, bytes)) else b, status, out)
        assert isinstance(out, dict) and out.get("error", {}).get("message"), (b, out)
    for path in (f"/addresses/{adr}/actions/assign", f"/addresses/{adr}/actions/unassign",
                 f"/addresses/{adr}", f"/addresses/{SRV}/actions/assign", f"/addresses/{SRV}",
                 "/addresses/adr_x/actions/assign", "/addresses/%00/actions/assign",
                 f"/addresses/{ADR}/actions/assign", f"/addresses/{adr.upper()}/actions/assign"):
        for method in ("POST", "PATCH", "GET", "DELETE", "PUT"):
            for b in ("", "[]", "null", json.dumps({"server_id": ADR}), json.dumps({"server_id": srv["id"], "x": 1}),
                      json.dumps({"server_id": [srv["id"]]}), json.dumps({}), json.dumps({"name": 5}),
                      json.dumps({"protection": {"delete": None}}), json.dumps({"auto_delete": "true"}),
                      json.dumps({"server_id": "srv_" + "0" * 26})):
                for token in (None, other):
                    status, out = await _raw(api, method, path, b, token)
                    assert status < 500, (method, path, b, token is other, status, out)
    # another tenant's server: unknown, like any id it cannot see
    status, out = await api.call("POST", f"/addresses/{adr}/actions/assign", json={"server_id": srv["id"]},
                                 token=other)
    assert status == 404, out
    _, token2 = await make_tenant(api.pool, "third")
    status, out = await api.call("POST", "/addresses", json={"region": REGION, "server_id": srv["id"]}, token=token2)
    assert status == 422 and "server_id" in out["error"]["message"], out
    for q in ("?server_id=x", "?region=" + "x" * 100, "?status=bogus", "?limit=-1", "?limit=99999999999999999999",
              "?after=%00", "?server_id=" + SRV + "&server_id=" + SRV, "?unknown=1", "?region=" + REGION):
        status, out = await api.call("GET", "/addresses" + q)
        assert status < 500, (q, status, out)
    # the only request that could be accepted: the owner's DELETE of its own address
    assert await _counts(api) == (before[0], before[1] + 1)
    assert await api.pool.fetchval("SELECT kind FROM jobs WHERE resource_id = $1 ORDER BY seq DESC LIMIT 1",
                                   adr) == "AddressUnassign"


async def _finish_all(api: Stack) -> None:
    await api.pool.execute("UPDATE jobs SET status = 'succeeded', finished_at = now()"
                           " WHERE status IN ('pending', 'running', 'retry')")


async def test_deletion_and_its_cancel_lock_the_server_the_address_is_on(api: Stack) -> None:
    """The deletion's AddressUnassign takes the address off its server's VM and the cancel's
    AddressAssign puts it back: both touch that server, so both hold its lock key like any
    assign — they are ordered with the server's own jobs, and the server's deletion waits for
    them (they count among its live jobs). They used to lock the address alone."""
    srv, _ = await api.create_server("lk-1")
    status, out = await api.call("POST", "/addresses", json={"region": REGION, "server_id": srv["id"]})
    assert status == 202, out
    adr = out["address"]["id"]
    await _finish_all(api)
    await api.pool.execute("UPDATE servers SET status = 'running' WHERE id = $1", srv["id"])

    status, out = await api.call("DELETE", f"/addresses/{adr}")
    assert status == 202 and out["job"]["kind"] == "AddressUnassign", out
    keys = await api.pool.fetchval("SELECT extra_lock_keys FROM jobs WHERE id = $1", out["job"]["id"])
    assert keys == [srv["id"]]
    assert await store.resource_count_live_jobs(api.pool, srv["id"]) == 1
    await _finish_all(api)

    status, out = await api.call("POST", f"/addresses/{adr}/actions/cancel-deletion")
    assert status == 202 and out["job"]["kind"] == "AddressAssign" and out["address"]["server_id"] == srv["id"], out
    keys = await api.pool.fetchval("SELECT extra_lock_keys FROM jobs WHERE id = $1", out["job"]["id"])
    assert keys == [srv["id"]]
    assert await store.resource_count_live_jobs(api.pool, srv["id"]) == 1


async def test_a_failed_assignment_can_be_retried_to_the_same_server(api: Stack) -> None:
    """An AddressAssign that failed leaves the address ``failed`` and still meant for its server
    (the world may hold it nowhere): assigning it to that server again is the retry, not a
    409 address_already_assigned (which left unassign + assign, two jobs, as the only way)."""
    srv, _ = await api.create_server("rt-1")
    status, out = await api.call("POST", "/addresses", json={"region": REGION, "server_id": srv["id"]})
    adr = out["address"]["id"]
    await api.pool.execute("UPDATE jobs SET status = 'failed', finished_at = now(),"
                           " error = '{\"class\": \"permanent\", \"message\": \"server has no VM\"}' WHERE resource_id = $1", adr)
    await api.pool.execute("UPDATE addresses SET status = 'failed', status_reason = 'server has no VM'"
                           " WHERE id = $1", adr)
    status, out = await api.call("POST", f"/addresses/{adr}/actions/assign", json={"server_id": srv["id"]})
    assert status == 202 and out["job"]["kind"] == "AddressAssign", out
    # an active one already there: still a 409 naming it
    await api.pool.execute("UPDATE addresses SET status = 'active' WHERE id = $1", adr)
    status, out = await api.call("POST", f"/addresses/{adr}/actions/assign", json={"server_id": srv["id"]})
    assert status == 409 and out["error"]["code"] == "address_already_assigned", out
