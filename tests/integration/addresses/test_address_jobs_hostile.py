"""Breaking issue 8's address jobs against the simulator over HTTPS (full stack)."""
from __future__ import annotations

from tests.support import REGION, SimAdmin, Stack
from tests.integration.addresses.test_addresses_api import _on_vms, _server
from z9.resources.address import store as address_store


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


# ---------------------------------------------------------------- SIGKILL in the new step

from pathlib import Path  # noqa: E402
from typing import AsyncIterator  # noqa: E402

import pytest  # noqa: E402

from z9.common import store  # noqa: E402
from z9.common.settings import Settings  # noqa: E402

from tests.support import Services, service_env, wait_until  # noqa: E402
from tests.integration.addresses.test_address_jobs import FAST, POOL  # noqa: E402


@pytest.fixture
async def services(settings: Settings, tmp_path: Path) -> AsyncIterator[Services]:
    assert settings.regions[REGION].address_pools == [POOL]
    svc = Services(service_env(settings, **FAST), tmp_path)
    try:
        yield svc
    finally:
        svc.close()


async def test_sigkill_while_the_filter_goes_off_finishes_once(api: Stack, sim: SimAdmin, services: Services) -> None:
    """The executor SIGKILLed during disable_ipfilter (after remove_entry and clear_ipconfig):
    the next attempt finds the VM by its tag still, turns the filter off and untags it."""
    services.start("scheduler")
    first = services.start("executor")
    s, job = await api.create_server("kp", public_ipv4=True)
    assert (await api.wait_job(job["id"], timeout_s=60))["status"] == "succeeded"
    pub = s["public_ipv4"]

    async def assigned() -> bool:
        return (await address_store.address_get(api.pool, pub["id"])).status == "active"
    await wait_until(assigned, 30, "the primary on its VM")
    status, out = await api.call("POST", f"/servers/{s['id']}/actions/shutdown")
    assert (await api.wait_job(out["job"]["id"], timeout_s=60))["status"] == "succeeded"
    vmid = (await api.server(s["id"]))["observed"]["vmid"]
    await sim.fault(method="PUT", path=r"/firewall/options$", action="delay", seconds=3.0, times=1)
    status, out = await api.call("POST", f"/addresses/{pub['id']}/actions/unassign")
    assert status == 202, out

    async def at_step() -> bool:
        j = await store.job_get(api.pool, out["job"]["id"])
        return any(x["name"] == "disable_ipfilter" and x["state"] == "running" for x in j.steps)
    await wait_until(at_step, 30, "the unassign to run disable_ipfilter")
    await first.kill()
    services.start("executor")
    done = await api.wait_job(out["job"]["id"], timeout_s=60)
    assert done["status"] == "succeeded" and done["attempt"] >= 2, done
    state = await sim.state()
    assert _on_vms(state, f"z9-addr-{pub['id']}", pub["ip"]) == ([], [])
    assert state["firewall"]["vms"][str(vmid)]["options"].get("ipfilter") in (None, "0")
    assert next(v for v in state["vms"] if v["vmid"] == vmid)["config"]["ipconfig0"] == "ip=dhcp"


async def test_a_primary_the_vm_does_not_use_never_turns_its_filter_on(stack: Stack, sim: SimAdmin) -> None:
    """A start queued before a primary's assignment (the API saw the server stopped) runs first;
    the assignment then fails ("running") and the address stays the server's in the database
    while the VM keeps DHCP. Whether to turn the IP filter on was decided from the database
    ("the server has a primary"): the next floating address assigned to the running server
    turned ipfilter on with only the floating IP in its set — the VM's DHCP address filtered at
    once. Now it is decided from the VM (a static ipconfig0 that the set holds)."""
    donor = await _server(stack, "donor", public_ipv4=True)
    p = donor["public_ipv4"]["id"]
    for path, body in ((f"/servers/{donor['id']}/actions/shutdown", None), (f"/addresses/{p}/actions/unassign", None)):
        status, out = await stack.call("POST", path, json=body)
        assert status == 202 and (await stack.wait_job(out["job"]["id"], timeout_s=60))["status"] == "succeeded"
    s = await _server(stack, "dh")
    status, out = await stack.call("POST", f"/servers/{s['id']}/actions/shutdown")
    assert (await stack.wait_job(out["job"]["id"], timeout_s=60))["status"] == "succeeded"
    status, start = await stack.call("POST", f"/servers/{s['id']}/actions/start")
    assert status == 202, start
    status, out = await stack.call("POST", f"/addresses/{p}/actions/assign", json={"server_id": s["id"]})
    assert status == 202, out
    failed = await stack.wait_job(out["job"]["id"], timeout_s=60)
    assert failed["status"] == "failed" and "running" in failed["error"]["message"], failed
    status, out = await stack.call("POST", "/addresses", json={"region": REGION, "server_id": s["id"]})
    assert status == 202, out
    job = await stack.wait_job(out["job"]["id"], timeout_s=60)
    assert job["status"] == "succeeded" and "enable_ipfilter" not in [x["name"] for x in job["steps"]], job
    state = await sim.state()
    vmid = s["observed"]["vmid"]
    vm = next(v for v in state["vms"] if v["vmid"] == vmid)
    assert vm["running"] and vm["config"]["ipconfig0"] == "ip=dhcp"
    assert state["firewall"]["vms"][str(vmid)].get("options", {}).get("ipfilter") in (None, "0")
    status, got = await stack.call("GET", f"/addresses/{out['address']['id']}")
    assert got["address"]["observed"]["enforced"] is False, got
