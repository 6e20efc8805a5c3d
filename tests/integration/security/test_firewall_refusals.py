"""Every refusal of the firewall API, with the code Hetzner Cloud gives it where it has one: the limits (50
rules, 500 effective, 100 CIDRs a rule, 5 firewalls a server), a port where the protocol takes none (and
none where it needs one), a second path to one server (``firewall_managed_by_label_selector`` naming the
entry that owns it: never both, so never an ownership deadlock), ``firewall_already_applied``, and
``resource_in_use`` for a delete while applied. The API alone: nothing here reaches Proxmox."""
from __future__ import annotations

from typing import Any

from tests.support import REGION, Stack

ANYWHERE = ["0.0.0.0/0", "::/0"]
SSH = {"direction": "in", "protocol": "tcp", "port": "22", "source_ips": ANYWHERE}


async def _post(api: Stack, path: str, body: dict[str, Any]) -> tuple[int, dict]:
    return await api.call("POST", path, json=body)


async def _firewall(api: Stack, name: str, **body: Any) -> dict:
    status, out = await _post(api, "/firewalls", {"name": name, "region": REGION, **body})
    assert status == 202, out
    return out["firewall"]


def _error(out: dict) -> tuple[str, str]:
    return out["error"]["code"], out["error"]["message"]


async def test_rule_shape_and_limits(api: Stack) -> None:
    cases: list[tuple[dict, str]] = [
        ({**SSH, "port": None}, "port: required for protocol tcp"),
        ({"direction": "in", "protocol": "icmp", "port": "8", "source_ips": ANYWHERE}, "port: not allowed for protocol icmp"),
        ({"direction": "in", "protocol": "esp", "port": "any", "source_ips": ANYWHERE}, "not allowed for protocol esp"),
        ({**SSH, "port": "85-80"}, "not a port"),
        ({**SSH, "port": "70000"}, "not a port"),
        ({**SSH, "source_ips": ["10.0.0.300/8"]}, "is not an IP address or CIDR"),
        ({**SSH, "source_ips": []}, "an in rule needs source_ips"),
        ({**SSH, "destination_ips": ANYWHERE}, "not allowed on an in rule"),
        ({"direction": "out", "protocol": "udp", "port": "53", "source_ips": ANYWHERE}, "not allowed on an out rule"),
        ({**SSH, "source_ips": [f"10.0.{i // 256}.{i % 256}" for i in range(101)]}, "at most 100"),
    ]
    for rule, words in cases:
        status, out = await _post(api, "/firewalls", {"name": "bad", "region": REGION, "rules": [rule]})
        assert status == 422, (rule, out)
        assert words in out["error"]["message"] or words in str(out["error"]["details"]), (words, out)
    # 100 CIDRs is the most, and fine
    ok = {**SSH, "source_ips": [f"10.0.{i // 256}.{i % 256}" for i in range(100)]}
    await _firewall(api, "hundred", rules=[ok])
    # more than 50 rules
    status, out = await _post(api, "/firewalls", {"name": "many", "region": REGION,
                                                  "rules": [{**SSH, "port": str(1000 + i)} for i in range(51)]})
    assert status == 422 and out["error"]["details"][0]["field"] == "rules", out
    assert "at most 50" in out["error"]["message"]
    await _firewall(api, "fifty", rules=[{**SSH, "port": str(1000 + i)} for i in range(50)])
    # more than 500 effective rules: 50 rules, each 100 long IPv6 addresses (8 PVE rules at pve-firewall's
    # 512-character address lists) and the members of 5 firewalls (5 more)
    others = [(await _firewall(api, f"peer-{i}"))["id"] for i in range(5)]
    v6 = [f"2001:db8:aaaa:bbbb:cccc:dddd:{i:04x}:1" for i in range(100)]
    rules = [{"direction": "in", "protocol": "tcp", "port": str(2000 + i), "source_ips": v6, "source_firewalls": others}
             for i in range(50)]
    status, out = await _post(api, "/firewalls", {"name": "effective", "region": REGION, "rules": rules})
    assert status == 422 and "effective rules; at most 500" in out["error"]["message"], out
    # a rule naming the members of a firewall that does not exist
    status, out = await _post(api, "/firewalls", {"name": "ghost", "region": REGION, "rules": [
        {"direction": "in", "protocol": "tcp", "port": "22", "source_firewalls": ["fw_" + "0" * 26]}]})
    assert status == 422 and out["error"]["details"][0]["field"] == "rules.0.source_firewalls", out


async def test_applied_to_refusals_and_delete_while_applied(api: Stack) -> None:
    web, _ = await api.create_server("web-1", labels={"role": "web"})
    plain, _ = await api.create_server("plain-1")
    fw = await _firewall(api, "web", rules=[SSH], applied_to=[{"label_selector": "role=web"}])
    assert [(m["server_id"], m["via"], m["status"]) for m in fw["members"]] == [(web["id"], "label_selector", "pending")]
    base = f"/firewalls/{fw['id']}/actions"

    # a server the selector holds, applied directly as well: refused, naming the selector that owns it
    status, out = await _post(api, f"{base}/apply_to_resources", {"apply_to": [{"server_id": web["id"]}]})
    assert status == 409 and out["error"]["code"] == "firewall_managed_by_label_selector", out
    assert "role=web" in out["error"]["message"]
    # ... nor taken off directly
    status, out = await _post(api, f"{base}/remove_from_resources", {"remove_from": [{"server_id": web["id"]}]})
    assert status == 409 and out["error"]["code"] == "firewall_managed_by_label_selector", out
    # the same selector twice
    status, out = await _post(api, f"{base}/apply_to_resources", {"apply_to": [{"label_selector": "role=web"}]})
    assert status == 409 and out["error"]["code"] == "firewall_already_applied", out
    # a server directly, twice
    status, out = await _post(api, f"{base}/apply_to_resources", {"apply_to": [{"server_id": plain["id"]}]})
    assert status == 202, out
    status, out = await _post(api, f"{base}/apply_to_resources", {"apply_to": [{"server_id": plain["id"]}]})
    assert status == 409 and out["error"]["code"] == "firewall_already_applied", out
    # a selector matching a server the firewall holds directly: refused, naming the server
    status, out = await api.call("PATCH", f"/servers/{plain['id']}", json={"labels": {"tier": "front"}})
    assert status == 200, out
    status, out = await _post(api, f"{base}/apply_to_resources", {"apply_to": [{"label_selector": "tier=front"}]})
    assert status == 409 and out["error"]["code"] == "firewall_managed_by_label_selector", out
    assert plain["id"] in out["error"]["message"]
    # no such server; not a selector
    status, out = await _post(api, f"{base}/apply_to_resources", {"apply_to": [{"server_id": "srv_" + "0" * 26}]})
    assert status == 422 and out["error"]["details"][0]["field"] == "apply_to.0.server_id", out
    status, out = await _post(api, f"{base}/apply_to_resources", {"apply_to": [{"label_selector": "a in b"}]})
    assert status == 422, out
    status, out = await _post(api, f"{base}/apply_to_resources", {"apply_to": [{"server_id": plain["id"],
                                                                               "label_selector": "x=y"}]})
    assert status == 422, out

    # delete while applied: 409 resource_in_use naming the servers
    status, out = await api.call("DELETE", f"/firewalls/{fw['id']}")
    assert status == 409 and out["error"]["code"] == "resource_in_use", out
    assert web["id"] in out["error"]["message"] and plain["id"] in out["error"]["message"]
    status, out = await _post(api, f"{base}/remove_from_resources",
                              {"remove_from": [{"label_selector": "role=web"}, {"server_id": plain["id"]}]})
    assert status == 202, out
    assert out["firewall"]["applied_to"] == []
    assert {m["status"] for m in out["firewall"]["members"]} == {"removing"}
    # still on the servers' VMs until its job took it off
    status, out = await api.call("DELETE", f"/firewalls/{fw['id']}")
    assert status == 409 and out["error"]["code"] == "resource_in_use", out


async def test_five_firewalls_a_server(api: Stack) -> None:
    s, _ = await api.create_server("busy-1")
    for i in range(5):
        await _firewall(api, f"fw-{i}", rules=[SSH], applied_to=[{"server_id": s["id"]}])
    status, out = await _post(api, "/firewalls", {"name": "sixth", "region": REGION, "rules": [SSH],
                                                  "applied_to": [{"server_id": s["id"]}]})
    assert status == 409 and out["error"]["code"] == "server_firewall_limit", out
    # nothing of the refused request stays (its name is free)
    status, out = await _post(api, "/firewalls", {"name": "sixth", "region": REGION, "rules": [SSH]})
    assert status == 202, out


async def _api_waiters(db: Any) -> int:
    """How many of the API's requests wait on a lock now (its pool's connections are named ``z9``)."""
    return int(await db.fetchval(
        "SELECT count(DISTINCT l.pid) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
        "WHERE NOT l.granted AND a.datname = current_database() AND a.pid <> pg_backend_pid() "
        "AND a.application_name = 'z9'"))


async def _held(api: Stack, hold: str, args: tuple[Any, ...], first: Any, second: Any) -> tuple[Any, Any]:
    """``first()`` sent while a lock (``hold``, in a transaction of the test's) stops it, then ``second()``
    once ``first`` waits, and the lock let go once both wait. Returns their answers."""
    import asyncio

    import asyncpg

    from tests.support import wait_until

    blocker = await asyncpg.connect(api.settings.database_url)
    try:
        tx = blocker.transaction()
        await tx.start()
        await blocker.execute(hold, *args)
        a = asyncio.create_task(first())
        await wait_until(lambda: _api_waiters(blocker), 20, "the first request waiting", interval_s=0.02)
        b = asyncio.create_task(second())

        async def both() -> bool:
            return await _api_waiters(blocker) >= 2
        await wait_until(both, 20, "the second request waiting too", interval_s=0.02)
        await tx.rollback()
        out = await asyncio.wait_for(asyncio.gather(a, b), 20)
    finally:
        await blocker.close()
    return out[0], out[1]


async def test_set_rules_naming_a_firewall_racing_its_delete_refuses_one_of_them(api: Stack) -> None:
    """``set-rules`` of G naming the members of X in flight with ``DELETE /firewalls/X`` — each held just
    before its job is written (the jobs table locked): the rule's check share-locks X, so the delete waits
    for it and sees the rule (409 ``resource_in_use``); the other way round, the rule's check waits for the
    delete and finds X gone (422). Never both 202: a rule naming a deleted firewall (before: both were)."""
    lock_jobs = "LOCK TABLE jobs IN ACCESS EXCLUSIVE MODE"
    for first in ("set-rules", "delete"):
        x = await _firewall(api, f"x-{first}")
        g = await _firewall(api, f"g-{first}")
        rule = {"direction": "in", "protocol": "tcp", "port": "5432", "source_firewalls": [x["id"]]}

        async def set_rules(g: dict = g, rule: dict = rule) -> tuple[int, dict]:
            return await _post(api, f"/firewalls/{g['id']}/actions/set-rules", {"rules": [rule]})

        async def delete(x: dict = x) -> tuple[int, dict]:
            return await api.call("DELETE", f"/firewalls/{x['id']}")

        if first == "set-rules":
            (ss, sout), (ds, dout) = await _held(api, lock_jobs, (), set_rules, delete)
            assert ss == 202, sout
            assert ds == 409 and _error(dout)[0] == "resource_in_use" and g["id"] in _error(dout)[1], dout
        else:
            (ds, dout), (ss, sout) = await _held(api, lock_jobs, (), delete, set_rules)
            assert ds == 202, dout
            assert ss == 422 and sout["error"]["details"][0]["field"] == "rules.0.source_firewalls", sout
        _, out = await api.call("GET", f"/firewalls/{g['id']}")
        named = [f for r in out["firewall"]["rules"] for f in r["source_firewalls"]]
        _, out = await api.call("GET", f"/firewalls/{x['id']}")
        assert (named == [x["id"]]) == (out["firewall"]["status"] not in ("deleting", "destroying", "deleted")), out


async def test_apply_to_a_server_racing_its_label_change_takes_one_lock_order(api: Stack) -> None:
    """``apply-to-resources`` of a firewall with a label selector to server S, in flight with ``PATCH
    /servers/S`` (its labels): both take S before the firewall (a relabel locks the server, then the
    firewalls whose selectors could take it), so both answer — never a deadlock's 503 (before: the apply
    locked the firewall, then S)."""
    s, _ = await api.create_server("racing-1", labels={"role": "db"})
    fw = await _firewall(api, "race-web", applied_to=[{"label_selector": "role=web"}])

    async def relabel() -> tuple[int, dict]:
        return await api.call("PATCH", f"/servers/{s['id']}", json={"labels": {"role": "db", "env": "prod"}})

    async def apply() -> tuple[int, dict]:
        return await _post(api, f"/firewalls/{fw['id']}/actions/apply-to-resources",
                           {"apply_to": [{"server_id": s["id"]}]})

    (rs, rout), (as_, aout) = await _held(api, "SELECT 1 FROM servers WHERE id = $1 FOR UPDATE", (s["id"],),
                                          relabel, apply)
    assert rs == 200, rout
    assert as_ == 202, aout
    _, out = await api.call("GET", f"/firewalls/{fw['id']}")
    assert [m["server_id"] for m in out["firewall"]["members"]] == [s["id"]], out
