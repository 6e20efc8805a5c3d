"""Load balancers against the strict appliance (real PostgreSQL, the simulator over HTTPS, Debian's
haproxy and keepalived judging every pushed file in the appliance, whose NIC is ens18): lb-small
and lb-ha reach ``healthy``; keepalived is rendered for the interface the guest reports and VRRP is
authenticated with a per-load-balancer key that appears in no answer, row or log; a file the real
tool refuses fails the job with the tool's words; long names still give valid appliance VM names."""
from __future__ import annotations

import json
import logging
import re
from typing import Any

import pytest

from z9.resources.load_balancer import LOAD_BALANCER
from z9.resources.load_balancer.jobs import shared as lb_jobs
from z9.sim.appliance import parse_keepalived

from tests.support import SimAdmin, Stack
from tests.integration.load_balancers.test_load_balancers import _appliances, _get, _lb, _listen, _server, lb_template  # noqa: F401

TCP = {"protocol": "tcp", "listen_port": 80, "destination_port": 8080,
       "health_check": {"protocol": "tcp", "port": 8080, "interval_s": 3, "timeout_s": 2, "retries": 2}}
DNS_LABEL = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")


async def _guest(sim: SimAdmin, vmid: int) -> dict[str, Any]:
    return await sim._req("GET", f"/guests/{vmid}")


def _nic_ips(g: dict[str, Any]) -> dict[str, list[str]]:
    return {i["name"]: [a["ip-address"] for a in i["ip-addresses"] if a["ip-address-type"] == "ipv4"]
            for i in g["interfaces"]}


async def test_lb_small_reaches_healthy_with_the_vip_on_the_appliances_own_nic(stack: Stack, sim: SimAdmin) -> None:
    """Before: lb-small's keepalived.conf had a unicast source and no peer (keepalived -t: exit 5)
    on a hard-coded eth0 (no such NIC on the appliance): the job failed."""
    srv = await _server(stack, "small-a")
    await _listen(sim, srv["observed"]["vmid"], 8080)
    lb, job = await _lb(stack, name="small", type="lb-small", services=[TCP],
                        targets=[{"type": "server", "server_id": srv["id"]}])
    done = await stack.wait_job(job["id"], timeout_s=120)
    assert done["status"] == "succeeded", done
    lb = await _get(stack, lb["id"])
    assert lb["status"] == "active" and lb["health"] == "healthy", lb
    (vm,) = _appliances(await sim.state(), lb["id"])
    g = await _guest(sim, vm["vmid"])
    ips = _nic_ips(g)
    assert "eth0" not in ips and lb["public_net"]["ipv4"]["ip"] in ips["ens18"]   # the VIP on the real NIC
    k = parse_keepalived(g["models"]["appliance"]["keepalived"])
    assert k["instances"] == [] and k["static"] == [(f"{lb['public_net']['ipv4']['ip']}/24", "ens18")]


async def test_lb_ha_reaches_healthy_authenticated_and_the_key_stays_secret(
        stack: Stack, sim: SimAdmin, caplog: pytest.LogCaptureFixture) -> None:
    """Every kind of service at once (tcp and http, http checks with a path and codes, proxy
    protocol, a check on another port, 16 services, least connections) through both appliances;
    unicast VRRP with IPSEC-AH and the load balancer's own key on ens18."""
    caplog.set_level(logging.DEBUG)
    a = await _server(stack, "ha-a")
    b = await _server(stack, "ha-b")
    for s in (a, b):
        for port in (8080, 9000):
            await _listen(sim, s["observed"]["vmid"], port)
    services = []
    for i in range(16):
        hc: dict[str, Any] = {"protocol": ("tcp", "http")[i % 2], "port": (8080, 9000)[i % 3 == 0],
                              "interval_s": 3, "timeout_s": 2, "retries": 2}
        if i % 2:
            hc["http"] = {"path": f"/healthz?svc={i}", "status_codes": ["2??", "301"]}
        services.append({"protocol": ("tcp", "http")[i % 2], "listen_port": 80 + i, "destination_port": 8080,
                         "proxyprotocol": i % 4 == 1, "health_check": hc})
    lb, job = await _lb(stack, name="ha-all", type="lb-ha", algorithm="least_connections", services=services,
                        targets=[{"type": "server", "server_id": a["id"]}, {"type": "server", "server_id": b["id"]}])
    done = await stack.wait_job(job["id"], timeout_s=180)
    assert done["status"] == "succeeded", done
    lb = await _get(stack, lb["id"])
    assert lb["health"] == "healthy", lb
    assert [m["holds_vip"] for m in lb["members"]].count(True) == 1
    apps = _appliances(await sim.state(), lb["id"])
    confs = [parse_keepalived((await _guest(sim, v["vmid"]))["models"]["appliance"]["keepalived"])["instances"][0]
             for v in apps]
    assert [c["interface"] for c in confs] == ["ens18", "ens18"]
    assert confs[0]["auth"] == confs[1]["auth"] and confs[0]["auth"][0] == "AH"
    key = confs[0]["auth"][1]
    assert len(key) == 8
    # the key is in the appliances' files only: not in any answer, job, row or log line
    answers = [json.dumps(await _get(stack, lb["id"]))]
    status, jobs = await stack.call("GET", f"/jobs?resource_id={lb['id']}")
    answers.append(json.dumps(jobs))
    for j in jobs["jobs"]:
        answers.append(json.dumps(await stack.job(j["id"])))
    async with stack.pool.acquire() as c:
        answers += [r[0] for r in await c.fetch("SELECT row_to_json(t)::text FROM load_balancers t")]
        answers += [r[0] for r in await c.fetch("SELECT row_to_json(t)::text FROM jobs t")]
    assert not [x for x in answers if key in x]
    assert key not in caplog.text
    # the other load balancer of the tenant gets another key
    lb2, job2 = await _lb(stack, name="ha-other", type="lb-ha", services=[TCP],
                          targets=[{"type": "server", "server_id": a["id"]}])
    assert (await stack.wait_job(job2["id"], timeout_s=180))["status"] == "succeeded"
    v2 = _appliances(await sim.state(), lb2["id"])[0]
    k2 = parse_keepalived((await _guest(sim, v2["vmid"]))["models"]["appliance"]["keepalived"])["instances"][0]
    assert k2["auth"][1] != key


async def test_a_keepalived_file_the_tool_refuses_fails_the_job_with_its_words(stack: Stack, sim: SimAdmin) -> None:
    """A push corrupted on the appliance's disk (the simulator's admin API): the real keepalived -t
    refuses it; the job fails permanently with keepalived's message, never succeeds."""
    await sim._req("POST", "/appliance-faults", json={"contains": "vrrp_instance", "inject": "bogus_keyword 1\n"})
    try:
        lb, job = await _lb(stack, name="ka-bad", type="lb-ha", services=[TCP],
                            targets=[{"type": "ip", "ip": "198.51.100.240"}])
        failed = await stack.wait_job(job["id"], timeout_s=180)
    finally:
        await sim._req("DELETE", "/appliance-faults")
    assert failed["status"] == "failed", failed
    msg = failed["error"]["message"]
    assert "keepalived rejected the configuration" in msg and "Unknown keyword 'bogus_keyword'" in msg, msg
    cur = await _get(stack, lb["id"])
    assert cur["status"] == "failed" and "Unknown keyword 'bogus_keyword'" in cur["status_reason"], cur
    key = lb_jobs.vrrp_key(stack.settings, await LOAD_BALANCER.get(stack.pool, lb["id"]))
    assert key not in msg and key not in json.dumps(cur)           # keepalived's words carry no key


@pytest.mark.parametrize("length", [59, 61])
async def test_long_names_give_valid_appliance_vm_names(stack: Stack, sim: SimAdmin, length: int) -> None:
    """Before: ``<name>-lb-N`` cut at 63 characters ended in ``-`` for names of 59-62 characters,
    a name Proxmox refuses (the create failed)."""
    name = ("long-" * 13)[:length - 1] + "x"
    lb, job = await _lb(stack, name=name, type="lb-ha", services=[TCP], targets=[{"type": "ip", "ip": "198.51.100.240"}])
    done = await stack.wait_job(job["id"], timeout_s=180)
    assert done["status"] == "succeeded", done
    names = [v["config"]["name"] for v in _appliances(await sim.state(), lb["id"])]
    assert len(names) == 2 and len(set(names)) == 2 and all(DNS_LABEL.match(n) for n in names), names
