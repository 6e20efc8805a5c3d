"""Breaking issue 8's address jobs against the simulator over HTTPS (full stack)."""
from __future__ import annotations

from tests.support import SimAdmin, Stack
from tests.test_addresses_api import _on_vms, _server


async def test_unassigning_a_primary_turns_the_ip_filter_off_again(stack: Stack, sim: SimAdmin) -> None:
    """A server created with public_ipv4 gets its VM's IP filter turned on (every address it uses
    is in its IP set). Unassigning the primary (server stopped) set ipconfig0 back to DHCP and
    emptied the set, but left ``ipfilter=1``: from its next boot the VM could not send from the
    address DHCP gives it — the very case the filter is kept off for. Now the filter goes off
    with the primary, and the job run again plans nothing."""
    s = await _server(stack, "pf", public_ipv4=True)
    vmid, pub = s["observed"]["vmid"], s["public_ipv4"]
    fw = (await sim.state())["firewall"]["vms"][str(vmid)]
    assert fw["options"].get("ipfilter") == "1", fw
    status, out = await stack.call("POST", f"/servers/{s['id']}/actions/shutdown")
    assert status == 202 and (await stack.wait_job(out["job"]["id"], timeout_s=60))["status"] == "succeeded"
    status, out = await stack.call("POST", f"/addresses/{pub['id']}/actions/unassign")
    assert status == 202, out
    job = await stack.wait_job(out["job"]["id"], timeout_s=60)
    assert job["status"] == "succeeded", job
    assert [x["name"] for x in job["steps"]] == ["remove_entry", "clear_ipconfig", "disable_ipfilter", "untag"]
    state = await sim.state()
    vm = next(v for v in state["vms"] if v["vmid"] == vmid)
    assert vm["config"]["ipconfig0"] == "ip=dhcp"
    assert state["firewall"]["vms"][str(vmid)]["options"].get("ipfilter") in (None, "0")
    assert _on_vms(state, f"z9-addr-{pub['id']}", pub["ip"]) == ([], [])
    status, out = await stack.call("GET", f"/addresses/{pub['id']}")
    assert out["address"]["server_id"] is None and out["address"]["observed"]["holder"] is None, out

    # assigned back (still stopped): the filter comes on again with it
    status, out = await stack.call("POST", f"/addresses/{pub['id']}/actions/assign", json={"server_id": s["id"]})
    assert status == 202, out
    job = await stack.wait_job(out["job"]["id"], timeout_s=60)
    assert job["status"] == "succeeded" and "enable_ipfilter" in [x["name"] for x in job["steps"]], job
    assert (await sim.state())["firewall"]["vms"][str(vmid)]["options"].get("ipfilter") == "1"
