"""Hostile bodies on the load balancer routes (issue 10), the API alone (no executor)."""
from __future__ import annotations

import asyncio

from tests.support import REGION, Stack, make_tenant
from tests.integration.load_balancers.test_load_balancers import SERVICE, _lb, lb_template  # noqa: F401


async def test_update_service_with_explicit_nulls_is_422_not_500(api: Stack) -> None:
    lb, _ = await _lb(api, name="nulls", services=[SERVICE])
    base = f"/load-balancers/{lb['id']}/actions/update_service"
    for field in ("protocol", "destination_port", "proxyprotocol"):
        status, out = await api.call("POST", base, json={"listen_port": 80, field: None})
        assert status == 422, (field, out)
        assert out["error"]["details"][0]["field"] == field, out
    status, out = await api.call("POST", base, json={"listen_port": 80, "health_check": None})
    assert status == 202, out                                # null health check: the one it has stays


async def test_an_ip_target_is_not_the_load_balancers_own_address(api: Stack) -> None:
    """The VIP or an appliance's address as a target would loop the traffic back into HAProxy."""
    lb, _ = await _lb(api, name="own", type="lb-ha", services=[SERVICE])
    base = f"/load-balancers/{lb['id']}/actions/add_target"
    for ip in (lb["public_net"]["ipv4"]["ip"], *(m["ip"] for m in lb["members"])):
        status, out = await api.call("POST", base, json={"type": "ip", "ip": ip})
        assert status == 422 and out["error"]["details"][0]["field"] == "ip", (ip, out)
    # at create, the addresses it is about to get (the pool's lowest free ones: the next VIP)
    vip = lb["members"][-1]["ip"].rsplit(".", 1)
    guess = f"{vip[0]}.{int(vip[1]) + 1}"
    status, out = await api.call("POST", "/load-balancers", json={
        "region": REGION, "name": "own2", "services": [SERVICE], "targets": [{"type": "ip", "ip": guess}]})
    assert status == 422, out
    async with api.pool.acquire() as c:             # nothing allocated
        assert await c.fetchval("SELECT count(*) FROM load_balancers WHERE name = 'own2'") == 0


async def test_ip_targets_that_are_not_hosts(api: Stack) -> None:
    lb, _ = await _lb(api, name="hosts", services=[SERVICE])
    base = f"/load-balancers/{lb['id']}/actions/add_target"
    for ip in ("255.255.255.255", "169.254.169.254", "240.0.0.1", "0.1.2.3", "0.0.0.0", "127.0.0.1", "224.0.0.1"):
        status, out = await api.call("POST", base, json={"type": "ip", "ip": ip})
        assert status == 422, (ip, out)
        status, out = await api.call("POST", "/load-balancers", json={
            "region": REGION, "name": "h2", "targets": [{"type": "ip", "ip": ip}]})
        assert status == 422, (ip, out)


async def test_the_same_target_added_concurrently_is_accepted_once(api: Stack) -> None:
    lb, _ = await _lb(api, name="race", services=[SERVICE])
    base = f"/load-balancers/{lb['id']}/actions"
    rs = await asyncio.gather(*[api.call("POST", f"{base}/add_target", json={"type": "ip", "ip": "192.0.2.77"})
                                for _ in range(4)])
    assert sorted(r[0] for r in rs) == [202, 409, 409, 409], rs
    assert {r[1]["error"]["code"] for r in rs if r[0] == 409} == {"target_already_defined"}
    rs = await asyncio.gather(*[api.call("POST", f"{base}/add_service", json={**SERVICE, "listen_port": 443})
                                for _ in range(3)])
    assert sorted(r[0] for r in rs) == [202, 409, 409], rs
    cur = (await api.call("GET", f"/load-balancers/{lb['id']}"))[1]["load_balancer"]
    assert [t["ip"] for t in cur["targets"]] == ["192.0.2.77"]
    assert [s["listen_port"] for s in cur["services"]] == [80, 443]


async def test_http_check_paths_that_haproxy_would_parse_as_quoting_or_comments(api: Stack) -> None:
    """A path with ``"``, ``'``, ``\\`` or ``#`` rendered into ``option httpchk GET …`` makes HAProxy's
    parser fail (unmatched quote) or cut the line (comment): 422 at the API, not a failed job later."""
    lb, _ = await _lb(api, name="paths", services=[SERVICE])
    base = f"/load-balancers/{lb['id']}/actions/update_service"
    for path in ('/a"b', "/a'b", "/a\\b", "/a#b", "/a<b>", "/a{b}", "/a|b", "/a`b", "/a^b"):
        hc = {"protocol": "http", "port": 8080, "interval_s": 3, "timeout_s": 2, "http": {"path": path}}
        status, out = await api.call("POST", base, json={"listen_port": 80, "health_check": hc})
        assert status == 422 and "path" in out["error"]["details"][0]["field"], (path, out)
    hc = {"protocol": "http", "port": 8080, "interval_s": 3, "timeout_s": 2,
          "http": {"path": "/health/check.php?a=1&b=%20x;c=(d)~e:@f!*+,$"}}
    status, out = await api.call("POST", base, json={"listen_port": 80, "health_check": hc})
    assert status == 202, out


async def test_update_service_merges_a_partial_health_check(api: Stack) -> None:
    """Hetzner's update_service takes every health_check field as optional and changes only those
    given: {"port": 9000} must not turn an http check on /healthz into a default tcp one."""
    hc = {"protocol": "http", "port": 8080, "interval_s": 30, "timeout_s": 5, "retries": 5,
          "http": {"path": "/healthz", "status_codes": ["200"]}}
    lb, _ = await _lb(api, name="merge", services=[{**SERVICE, "health_check": hc}])
    base = f"/load-balancers/{lb['id']}/actions/update_service"
    status, out = await api.call("POST", base, json={"listen_port": 80, "health_check": {"port": 9000}})
    assert status == 202, out
    got = out["load_balancer"]["services"][0]["health_check"]
    assert got == {**hc, "port": 9000}, got
    # a change that breaks a rule of the merged check names it (timeout above the interval)
    status, out = await api.call("POST", base, json={"listen_port": 80, "health_check": {"timeout_s": 60}})
    assert status == 422, out
    # switching to tcp drops the http part; back to http gets the default one
    status, out = await api.call("POST", base, json={"listen_port": 80, "health_check": {"protocol": "tcp"}})
    assert status == 202 and out["load_balancer"]["services"][0]["health_check"]["http"] is None, out
    status, out = await api.call("POST", base, json={"listen_port": 80, "health_check": {"port": None}})
    assert status == 422, out


async def test_an_ip_target_is_not_another_tenants_address(api: Stack) -> None:
    """Another tenant's address as an ip target would let the appliances probe and forward to a
    host this tenant does not own (a server target of another tenant is refused the same way)."""
    _, other = await make_tenant(api.pool, "neighbour")
    status, out = await api.call("POST", "/addresses", token=other, json={"region": REGION, "name": "theirs"})
    assert status == 202, out
    theirs = out["address"]["ip"]
    lb, _ = await _lb(api, name="probe", services=[SERVICE])
    status, out = await api.call("POST", f"/load-balancers/{lb['id']}/actions/add_target",
                                 json={"type": "ip", "ip": theirs})
    assert status == 422 and out["error"]["details"][0]["field"] == "ip", out
    status, out = await api.call("POST", "/load-balancers", json={
        "region": REGION, "name": "probe2", "services": [SERVICE], "targets": [{"type": "ip", "ip": theirs}]})
    assert status == 422, out
    assert out["error"]["details"][0]["rule"] == "another_tenant", out
    # the tenant's own address stays fine as an ip target; an IP of the pool nobody holds does not
    # (the pool may hand it to another tenant tomorrow)
    status, out = await api.call("POST", "/addresses", json={"region": REGION, "name": "mine"})
    assert status == 202, out
    status, out = await api.call("POST", f"/load-balancers/{lb['id']}/actions/add_target",
                                 json={"type": "ip", "ip": out["address"]["ip"]})
    assert status == 202, out
    status, out = await api.call("POST", f"/load-balancers/{lb['id']}/actions/add_target",
                                 json={"type": "ip", "ip": "203.0.113.240"})
    assert status == 422 and out["error"]["details"][0]["rule"] == "address_pool", out
