"""The Proxmox IP filter on the guests z9 makes with addresses it knows: a load balancer's
appliances may send only from their own address and the VIP (keepalived moves it), so a guest
cannot take an address it was not given (the simulator drops it: tests/sim/test_sim_ipfilter.py).
With the datacenter firewall on, everything z9 made keeps working."""
from __future__ import annotations

from z9.common.tags import normalize_tags

from tests.support import SimAdmin, Stack
from tests.integration.load_balancers.test_load_balancers import LB_TEMPLATE, SERVICE, _get, _lb, _listen, _server


async def test_appliances_send_only_from_their_address_and_the_vip(stack: Stack, sim: SimAdmin) -> None:
    await sim._req("POST", "/vms", json=LB_TEMPLATE)
    fw = sim.server.cluster.firewall
    fw.cluster_options["enable"] = "1"  # the datacenter firewall on: every VM's filter is in force
    try:
        target = await _server(stack, "filtered-web")
        await _listen(sim, target["observed"]["vmid"], 8080)
        lb, job = await _lb(stack, name="filtered", type="lb-ha", services=[SERVICE],
                            targets=[{"type": "server", "server_id": target["id"]}])
        done = await stack.wait_job(job["id"], timeout_s=120)
        assert done["status"] == "succeeded", done
        lb = await _get(stack, lb["id"])
        vip = lb["public_net"]["ipv4"]["ip"]
        apps = [v for v in (await sim.state())["vms"] if f"z9-id-{lb['id']}" in normalize_tags(v["config"].get("tags"))]
        assert len(apps) == 2
        own = set()
        for v in apps:
            vmfw = fw.vm(v["vmid"])
            assert vmfw.options.get("enable") == "1" and vmfw.options.get("ipfilter") == "1", vmfw.options
            assert "firewall=1" in v["config"]["net0"].split(","), v["config"]["net0"]
            entries = {e["cidr"] for e in vmfw.ipsets["ipfilter-net0"]}
            assert vip in entries and len(entries) == 2, entries
            own |= entries - {vip}
            assert v["config"]["ipconfig0"].startswith(f"ip={(entries - {vip}).pop()}/")
        assert len(own) == 2  # each its own address, never the other's
        # the filter in force, the appliances and the target still work: healthy, the VIP held
        assert lb["health"] == "healthy", lb
        assert [m["holds_vip"] for m in lb["members"]].count(True) == 1
        # the next job observes the filter as it is: nothing to do for it
        status, out = await stack.call("POST", f"/load-balancers/{lb['id']}/actions/change_algorithm",
                                       json={"type": "least_connections"})
        assert status == 202, out
        again = await stack.wait_job(out["job"]["id"], timeout_s=60)
        assert again["status"] == "succeeded" and "ip_filter" not in [s["name"] for s in again["steps"]], again
    finally:
        fw.cluster_options.pop("enable", None)
