"""Every guest z9 makes has DNS: the region's ``nameservers`` (else its network's own) are written
into its network-config — a server's and a load balancer's through Proxmox's cloud-init drive
(``nameserver``), a cluster member's through z9's NoCloud ISO (``type: nameserver``) — and Debian's
renderer, run for real by the simulator (``cloud-init devel net-convert``), turns them into the
guest's resolv.conf. A guest whose resolv.conf names none fails its job's verify, naming that."""
from __future__ import annotations

import pytest

from tests.integration.clusters.test_clusters_e2e import K8S_TIMING
from tests.support import REGION, SimAdmin, Stack


def cluster_body(name: str) -> dict:
    return {"name": name, "region": REGION, "version": "1.33",
            "control_plane": {"count": 1, "cores": 2, "memory_mib": 2048, "disk_gib": 10},
            "node_pools": [{"name": "workers", "count": 1, "cores": 1, "memory_mib": 1024, "disk_gib": 10}]}


async def nameservers(sim: SimAdmin, vmid: int) -> list[str]:
    return (await sim._req("GET", f"/guests/{vmid}"))["nameservers"]


async def test_servers_and_cluster_members_get_the_regions_nameservers(stack: Stack, sim: SimAdmin) -> None:
    await sim.configure(**K8S_TIMING)
    server, job = await stack.create_server("dns")
    status, cl = await stack.call("POST", "/clusters", json=cluster_body("dns"))
    assert status == 202, cl
    for j in (job, cl["job"]):
        done = await stack.wait_job(j["id"], timeout_s=180)
        assert done["status"] == "succeeded", done
    vmid = (await stack.server(server["id"]))["observed"]["vmid"]
    assert await nameservers(sim, vmid) == ["198.51.100.53"]
    status, out = await stack.call("GET", f"/clusters/{cl['cluster']['id']}")
    members = out["cluster"]["members"]
    assert len(members) == 2
    for m in members:
        assert await nameservers(sim, m["vmid"]) == ["198.51.100.53"], m
    # a server with a public address: its pool's own nameservers
    server, job = await stack.create_server("dns-public", public_ipv4=True)
    assert (await stack.wait_job(job["id"], timeout_s=120))["status"] == "succeeded"
    assert await nameservers(sim, (await stack.server(server["id"]))["observed"]["vmid"]) == ["203.0.113.53"]


# A region naming no nameservers: a cluster member's ISO (no Proxmox drive, so no fallback to the
# node's resolv.conf) gives its guest no DNS — image pulls and the pod network would fail on real
# machines; the create fails at its verify, naming it.
@pytest.mark.settings(region={"nameservers": []})
async def test_a_member_without_dns_fails_the_create_naming_it(stack: Stack, sim: SimAdmin) -> None:
    await sim.configure(**K8S_TIMING)
    status, cl = await stack.call("POST", "/clusters", json=cluster_body("nodns"))
    assert status == 202, cl
    done = await stack.wait_job(cl["job"]["id"], timeout_s=180)
    assert done["status"] == "failed", done
    assert "has no DNS" in done["error"]["message"] and "/etc/resolv.conf names no nameserver" in \
        done["error"]["message"], done["error"]
