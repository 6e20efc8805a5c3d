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
