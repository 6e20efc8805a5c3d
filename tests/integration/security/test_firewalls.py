"""Firewalls (Hetzner Cloud's shape) compiled into each member server's own VM firewall, against the
simulator over HTTPS with pve-firewall's 10 s cycle on a clock the test steps: what a firewall opens is
delivered, what it does not is dropped (``sim.deliver``), the server kind's platform part stays, a member is
``applied`` only after the cycle, and ``enforced: false`` while the datacenter firewall is off."""
from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from z9.common.clock import TestClock

from tests.support import REGION, SimAdmin, Stack, wait_until

OUTSIDE = "203.0.113.9"
ANYWHERE = ["0.0.0.0/0", "::/0"]
SSH_HTTPS = [{"direction": "in", "protocol": "tcp", "port": "22", "source_ips": ANYWHERE},
             {"direction": "in", "protocol": "tcp", "port": "443", "source_ips": ANYWHERE, "description": "https"}]


@pytest.fixture
async def firewall_on(sim: SimAdmin) -> AsyncIterator[None]:
    fw = sim.server.cluster.firewall
    fw.cluster_options["enable"] = "1"
    await sim.firewall_cycle()
    try:
        yield
    finally:
        fw.cluster_options.pop("enable", None)


async def _server(stack: Stack, name: str, **over: Any) -> dict:
    server, job = await stack.create_server(name, public_ipv4=True, **over)
    assert (await stack.wait_job(job["id"], timeout_s=90))["status"] == "succeeded"

    async def settled() -> Any:
        s = await stack.server(server["id"])
        return s if s["public_ipv4"] and s["observed"] and s["observed"].get("vmid") else None
    return await wait_until(settled, 30, "the server's address")


def _ip(server: dict) -> str:
    v = server["public_ipv4"]
    return str(v["ip"] if isinstance(v, dict) else v)


async def _deliver(sim: SimAdmin, src: str | int, dst: str | int, proto: str = "tcp", port: int | None = None) -> bool:
    return bool((await sim.deliver(src, dst, proto, port))["delivered"])


async def _firewall(stack: Stack, **body: Any) -> tuple[dict, dict]:
    status, out = await stack.call("POST", "/firewalls", json={"region": REGION, **body})
    assert status == 202, out
    return out["firewall"], out["job"]


async def _get(stack: Stack, fid: str) -> dict:
    status, out = await stack.call("GET", f"/firewalls/{fid}")
    assert status == 200, out
    return out["firewall"]


async def _applied(stack: Stack, clock: TestClock, job_id: str) -> dict:
    """Step the clock past pve-firewall's cycle while the job waits for it; the job's end."""
    async def waiting_or_done() -> Any:
        j = await stack.job(job_id)
        if j["status"] in ("succeeded", "failed"):
            return j
        return j if any(s["name"] == "wait_cycle" and s["state"] == "running" for s in j["steps"]) else None
    await wait_until(waiting_or_done, 60, "the job waiting for the firewall cycle")
    clock.step(12)
    return await stack.wait_job(job_id, timeout_s=60)


async def test_a_firewall_on_a_server_opens_its_ports_and_drops_the_rest(
        stack: Stack, sim: SimAdmin, firewall_on: None, clock: TestClock) -> None:
    a = await _server(stack, "fw-a")
    b = await _server(stack, "fw-b")  # no firewall: everything still open
    fw, job = await _firewall(stack, name="web", rules=SSH_HTTPS, applied_to=[{"server_id": a["id"]}])
    assert [m["status"] for m in fw["members"]] == ["pending"]
    done = await _applied(stack, clock, job["id"])
    assert done["status"] == "succeeded", done
    await sim.firewall_cycle()
    got = await _get(stack, fw["id"])
    assert got["status"] == "active", got
    assert [(m["server_id"], m["status"], m["enforced"]) for m in got["members"]] == [(a["id"], "applied", True)], got
    vmid = a["observed"]["vmid"]
    opts = sim.server.cluster.firewall.vm(vmid).options
    assert (opts.get("policy_in"), opts.get("policy_out")) == ("DROP", "ACCEPT"), opts
    for port in (22, 443):
        assert await _deliver(sim, OUTSIDE, _ip(a), "tcp", port)
    assert not await _deliver(sim, OUTSIDE, _ip(a), "tcp", 80)
    assert not await _deliver(sim, OUTSIDE, _ip(a), "udp", 53)
    assert await _deliver(sim, OUTSIDE, _ip(b), "tcp", 80)
    comments = [r.get("comment") for r in sim.server.cluster.firewall.vm(vmid).rules]
    assert comments == [f"z9 firewall {fw['id']}: rule 0", f"z9 firewall {fw['id']}: rule 1: https"], comments
