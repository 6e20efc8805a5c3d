"""z9 on a privilege-separated Proxmox API token holding exactly the privileges the README's operator
section names (its ``pveum role add`` line is read here, so the two cannot drift): every flow —
a server, an address, an lb-small and an lb-ha, a 1+1 cluster, a volume created, attached, grown,
detached and deleted — runs and is deleted. A token lacking one privilege gets PVE's 403
``Permission check failed (<path>, <privilege>)`` (the simulator checks as pve-access-control
``RPCEnvironment.pm`` and qemu-server ``API2/Qemu.pm`` do) and the job fails at once with a
permanent error naming it."""
from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import pytest
from z9.common.settings import Settings
from z9.sim.server import SimServer
from z9.common.tags import identity_tag

from tests.conftest import make_settings
from tests.support import REGION, SimAdmin, Stack, wait_until

README = Path(__file__).resolve().parents[3] / "README.md"
TOKEN = "z9@pve!z9"


def readme_privileges() -> list[str]:
    m = re.search(r'pveum role add Z9 -privs "([^"]+)"', README.read_text())
    assert m, "README: the operator section's 'pveum role add Z9 -privs \"…\"' line"
    return m.group(1).split()


@pytest.fixture
async def settings(request: pytest.FixtureRequest, db_url: str, sim_server: SimServer, sim: SimAdmin) -> Settings:
    """The test region's executor authenticates with z9@pve's privilege-separated token: the user
    and the token both hold the role on / (``pveum acl modify / --users … --tokens …``), less the
    privileges a test's ``without`` marker names (taken from the token only). Made after the
    simulator's reset (which forgets tokens); ``@pytest.mark.settings`` as conftest's fixture."""
    marker = request.node.get_closest_marker("without")
    privs = readme_privileges()
    lacking = set(marker.args) if marker else set()
    tok = await sim._req("POST", "/tokens", json={
        "tokenid": TOKEN, "privsep": True,
        "user_acl": [{"path": "/", "privs": privs}],
        "acl": [{"path": "/", "privs": [p for p in privs if p not in lacking]}]})
    overrides: dict[str, Any] = {}
    for m in reversed(list(request.node.iter_markers("settings"))):
        overrides.update(m.kwargs)
    return make_settings(db_url, sim_server, region={"token_id": TOKEN, "token_secret": tok["value"]}, **overrides)


async def _gone(stack: Stack, sim: SimAdmin, path: str, rid: str, key: str) -> None:
    async def deleted() -> bool:
        status, out = await stack.call("GET", f"/{path}/{rid}")
        return status == 404 or out[key]["status"] == "deleted"
    await wait_until(deleted, 240, f"{rid} deleted")
    assert await sim.vms_tagged(identity_tag(rid)) == []


async def _ok(stack: Stack, status: int, out: dict) -> dict:
    assert status == 202, out
    done = await stack.wait_job(out["job"]["id"], timeout_s=300)
    assert done["status"] == "succeeded", done
    return out


# Every flow of z9 on the README's role: server; address (assigned, moved off, deleted); lb-small
# and lb-ha; a 1+1 cluster; a volume created, attached, grown, detached, deleted.
@pytest.mark.timeout(900)
@pytest.mark.settings(deletion_buffer_s=0.3)
async def test_a_token_with_the_readme_privileges_runs_every_flow(stack: Stack, sim: SimAdmin) -> None:
    from tests.integration.clusters.test_clusters_e2e import K8S_TIMING, body as cluster_body
    from tests.integration.load_balancers.test_load_balancers import LB_TEMPLATE

    await sim._req("POST", "/vms", json=LB_TEMPLATE)
    await sim.configure(**K8S_TIMING)
    server, job = await stack.create_server("privsep")
    status, small = await stack.call("POST", "/load-balancers", json={"region": REGION, "name": "privsep-s",
                                                                       "type": "lb-small"})
    assert status == 202, small
    status, lb = await stack.call("POST", "/load-balancers", json={"region": REGION, "name": "privsep", "type": "lb-ha"})
    assert status == 202, lb
    status, cl = await stack.call("POST", "/clusters", json=cluster_body("privsep", cps=1, workers=1))
    assert status == 202, cl
    status, vol = await stack.call("POST", "/volumes", json={"name": "privsep", "region": REGION, "size_gib": 2})
    assert status == 202, vol
    for j in (job, small["job"], lb["job"], cl["job"], vol["job"]):
        done = await stack.wait_job(j["id"], timeout_s=300)
        assert done["status"] == "succeeded", done
    apps = await sim.vms_tagged(identity_tag(lb["load_balancer"]["id"]))
    assert len({a["node"] for a in apps}) == 2  # the lb-ha's members on two nodes (a migration: VM.Migrate)

    sid, vid = server["id"], vol["volume"]["id"]
    adr = (await _ok(stack, *await stack.call("POST", "/addresses", json={
        "region": REGION, "name": "privsep", "server_id": sid})))["address"]["id"]
    await _ok(stack, *await stack.call("POST", f"/addresses/{adr}/actions/unassign"))
    await _ok(stack, *await stack.call("POST", f"/volumes/{vid}/actions/attach", json={"server_id": sid}))
    await _ok(stack, *await stack.call("POST", f"/volumes/{vid}/actions/resize", json={"size_gib": 3}))
    await _ok(stack, *await stack.call("POST", f"/volumes/{vid}/actions/detach"))

    kinds = (("volumes", vid, "volume"), ("addresses", adr, "address"), ("servers", sid, "server"),
             ("load-balancers", small["load_balancer"]["id"], "load_balancer"),
             ("load-balancers", lb["load_balancer"]["id"], "load_balancer"), ("clusters", cl["cluster"]["id"], "cluster"))
    for path, rid, _ in kinds:
        status, out = await stack.call("DELETE", f"/{path}/{rid}")
        assert status == 202, out
    await asyncio.gather(*(_gone(stack, sim, path, rid, key) for path, rid, key in kinds))
    refused = [r for r in (await sim.counters())["requests"] if r["status"] == 403]
    assert refused == [], refused  # not one call the token may not make


@pytest.mark.without("VM.Clone")
async def test_a_token_lacking_a_privilege_fails_the_job_naming_it(stack: Stack, sim: SimAdmin) -> None:
    server, job = await stack.create_server("no-clone")
    done = await stack.wait_job(job["id"], timeout_s=90)
    assert done["status"] == "failed" and done["attempt"] == 1, done
    msg = done["error"]["message"]
    assert "the region's API token lacks a privilege" in msg and re.search(r"Permission check failed \(/vms/\d+, VM\.Clone\)", msg), msg
    assert await sim.vms_tagged(identity_tag(server["id"])) == []


# Private networks on the README's role: the zone, VNets, the lock and the apply (SDN.Allocate, SDN.Audit),
# a server's NIC on a VNet at its create and later (SDN.Use on /sdn/zones/<zone>/<vnet>), detached, deleted.
@pytest.mark.timeout(300)
@pytest.mark.settings(deletion_buffer_s=0.3, sdn_apply_batch_s=0.3)
async def test_a_token_with_the_readme_privileges_runs_the_network_flow(stack: Stack, sim: SimAdmin) -> None:
    net = await _ok(stack, *await stack.call("POST", "/networks", json={"name": "privsep", "region": REGION,
                                                                          "ip_range": "10.9.0.0/24"}))
    nid = net["network"]["id"]
    status, out = await stack.call("POST", "/servers", json={
        "name": "privsep-n", "region": REGION, "image": "debian-12", "cores": 1, "memory_mib": 1024, "disk_gib": 10,
        "networks": [{"network_id": nid}]})
    assert status == 202, out
    for j in out["jobs"]:
        done = await stack.wait_job(j["id"], timeout_s=120)
        assert done["status"] == "succeeded", done
    other, job = await stack.create_server("privsep-m")
    assert (await stack.wait_job(job["id"], timeout_s=120))["status"] == "succeeded"
    await _ok(stack, *await stack.call("POST", f"/servers/{other['id']}/actions/attach_to_network",
                                       json={"network_id": nid}))
    for sid in (out["server"]["id"], other["id"]):
        await _ok(stack, *await stack.call("POST", f"/servers/{sid}/actions/detach_from_network",
                                           json={"network_id": nid}))
    status, gone = await stack.call("DELETE", f"/networks/{nid}")
    assert status == 202, gone

    async def deleted() -> bool:
        _, got = await stack.call("GET", f"/networks/{nid}")
        return got["network"]["status"] == "deleted"
    await wait_until(deleted, 120, f"{nid} deleted")
    refused = [r for r in (await sim.counters())["requests"] if r["status"] == 403]
    assert refused == [], refused  # not one call the token may not make


@pytest.mark.without("SDN.Allocate")
@pytest.mark.settings(sdn_apply_batch_s=0.2)
async def test_a_token_lacking_sdn_allocate_fails_the_network_naming_it(stack: Stack, sim: SimAdmin) -> None:
    status, out = await stack.call("POST", "/networks", json={"name": "no-sdn", "region": REGION,
                                                               "ip_range": "10.8.0.0/24"})
    assert status == 202, out
    done = await stack.wait_job(out["job"]["id"], timeout_s=120)
    assert done["status"] == "failed", done
    msg = done["error"]["message"]
    assert "the region's API token lacks a privilege" in msg and "SDN.Allocate" in msg, msg


@pytest.mark.without("Sys.Modify")
async def test_a_firewall_naming_another_firewalls_members_needs_sys_modify(stack: Stack, sim: SimAdmin) -> None:
    """Cluster IP sets ("members of firewall X") are written on cluster.fw: pve-firewall's ClusterIPSetList
    checks Sys.Modify on / (the README's role holds it for that alone); without it the job fails at once,
    naming it — a firewall without such a rule needs none."""
    server, job = await stack.create_server("fw-priv")
    assert (await stack.wait_job(job["id"], timeout_s=90))["status"] == "succeeded"
    status, apps = await stack.call("POST", "/firewalls", json={"name": "apps", "region": REGION})
    assert status == 202, apps
    assert (await stack.wait_job(apps["job"]["id"], timeout_s=60))["status"] == "succeeded"
    status, out = await stack.call("POST", "/firewalls", json={
        "name": "dbs", "region": REGION, "applied_to": [{"server_id": server["id"]}],
        "rules": [{"direction": "in", "protocol": "tcp", "port": "5432", "source_firewalls": [apps["firewall"]["id"]]}]})
    assert status == 202, out
    done = await stack.wait_job(out["job"]["id"], timeout_s=60)
    assert done["status"] == "failed" and done["attempt"] == 1, done
    assert re.search(r"Permission check failed \(/, Sys\.Modify\)", done["error"]["message"]), done["error"]
