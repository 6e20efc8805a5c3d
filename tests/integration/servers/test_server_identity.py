"""A server's VM boots with exactly the identity its request asked for (issue 18 §2), against the
simulator's guest model: a template's own cloud-init values and seed ISO do not travel with the clone,
a guest that booted from another seed or whose cloud-init failed is not shown ``running`` as if
nothing happened."""
from __future__ import annotations

from typing import Any

import pytest

from z9.common.tags import identity_tag
from z9.sim.server import BUILDER_SSH_KEY, put_builder_template

from tests.support import SimAdmin, Stack, wait_until

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHJ058JkmDc3sBXLLfF+PS59IDULSD3JlYs6wRqCPjyx carol@laptop"


async def _builder_image(sim: SimAdmin) -> None:
    """The region's debian-12 is a template an image builder left: its sshkeys, ciuser and a seed
    ISO of its own on sata0 (the device NoCloud would take)."""
    await sim.set_config(9000, name="debian-12-old")
    put_builder_template(sim.server.cluster, vmid=9001, name="debian-12")
    await sim._req("POST", "/stats/refresh")


async def _vm_and_guest(sim: SimAdmin, server_id: str) -> tuple[dict[str, Any], dict[str, Any]]:
    [vm] = await sim.vms_tagged(identity_tag(server_id))
    return vm, await sim._req("GET", f"/guests/{vm['vmid']}")


def _file(sim: SimAdmin, vmid: int, path: str) -> bytes | None:
    return sim.server.cluster.guests.guests[vmid].read_file(path)


async def test_a_clone_of_a_builder_template_boots_with_only_its_own_identity(stack: Stack, sim: SimAdmin) -> None:
    """No key asked for: no key authorized (the template's sshkeys do not travel), the user is the
    image's default (not the builder's ciuser), and the guest boots from its own drive (not the
    template's seed ISO) — hostname and instance-id as z9's drive gives them. With a key: that key only."""
    await _builder_image(sim)
    server, job = await stack.create_server("bare", ssh_keys=[])
    done = await stack.wait_job(job["id"], timeout_s=60)
    assert done["status"] == "succeeded", done
    vm, guest = await _vm_and_guest(sim, server["id"])
    assert not {"sshkeys", "ciuser", "sata0"} & set(vm["config"]), vm["config"]
    assert vm["config"]["ide2"].startswith(f"local-lvm:vm-{vm['vmid']}-cloudinit")
    assert guest["inputs"]["source"] == f"ide2:local-lvm:vm-{vm['vmid']}-cloudinit"
    assert guest["hostname"] == "bare" and guest["instance_id"] != "debian-12-build"
    assert guest["cloud_init"]["status"] == "done", guest
    keys = [p for p in guest["files"] if p.endswith("/.ssh/authorized_keys")]
    assert keys == [], {p: _file(sim, vm["vmid"], p) for p in keys}
    assert (await stack.server(server["id"]))["status"] == "running"

    server, job = await stack.create_server("keyed", ssh_keys=[KEY])
    assert (await stack.wait_job(job["id"], timeout_s=60))["status"] == "succeeded"
    vm, guest = await _vm_and_guest(sim, server["id"])
    assert [p for p in guest["files"] if p.endswith("/.ssh/authorized_keys")] == ["/home/debian/.ssh/authorized_keys"]
    assert _file(sim, vm["vmid"], "/home/debian/.ssh/authorized_keys") == (KEY + "\n").encode()
    assert BUILDER_SSH_KEY.encode() not in b"".join(_file(sim, vm["vmid"], p) or b"" for p in guest["files"])


async def test_a_guest_that_booted_from_another_seed_is_noticed(stack: Stack, sim: SimAdmin) -> None:
    """A seed ISO attached behind z9's back between its configure step and the start (the start task
    held meanwhile): the guest boots from it; verify reads the guest's instance-id and hostname, the
    job fails naming it and the server is failed with that reason (its VM observed, running)."""
    await _builder_image(sim)
    await sim.hold_tasks("qmstart")
    server, job = await stack.create_server("web-1")
    [vm] = await _wait_vm_started(stack, sim, server["id"])
    # in place (an admin replace would swap the VM object under the held start task)
    sim.server.cluster.vms[vm["vmid"]].config["sata0"] = "local:iso/debian-12-seed.iso,media=cdrom"
    await sim.release_tasks("qmstart")
    done = await stack.wait_job(job["id"], timeout_s=60)
    assert done["status"] == "failed", done
    assert "booted from another seed" in done["error"]["message"] and "debian-12-build" in done["error"]["message"]
    srv = await stack.server(server["id"])
    assert srv["status"] == "failed" and "booted from another seed" in srv["status_reason"], srv
    assert (srv["observed"]["vmid"], srv["observed"]["power_state"]) == (vm["vmid"], "running")


async def _wait_vm_started(stack: Stack, sim: SimAdmin, server_id: str) -> list[dict[str, Any]]:
    from tests.support import wait_until

    async def started() -> Any:
        st = await sim.state()
        vms = [v for v in st["vms"] if identity_tag(server_id) in (v["config"].get("tags") or "")]
        return vms if vms and any(t["type"] == "qmstart" and t["id"] == str(vms[0]["vmid"]) for t in st["tasks"]) else None

    return await wait_until(started, 30, "the start task of the server's VM")


async def test_a_cloud_init_failure_in_the_guest_shows_on_the_server(stack: Stack, sim: SimAdmin) -> None:
    """cloud-init fails in the guest (the simulator's guest fault): the create job fails with
    cloud-init's error text, the server is failed with it as status_reason — not running."""
    await sim._req("POST", "/guest-faults", json={"kind": "cloud_init_fails", "name": "web-1",
                                                  "message": "Failed to run module scripts_user"})
    server, job = await stack.create_server("web-1")
    done = await stack.wait_job(job["id"], timeout_s=60)
    assert done["status"] == "failed", done
    assert done["error"]["message"].startswith("cloud-init failed in the guest of VM ")
    srv = await stack.server(server["id"])
    assert srv["status"] == "failed", srv
    assert srv["status_reason"].endswith("Failed to run module scripts_user"), srv
    assert srv["observed"]["power_state"] == "running" and srv["observed"]["vmid"] is not None


@pytest.mark.settings(server_guest_slot_s=0.5)
async def test_a_guest_that_never_boots_gives_its_executor_slot_back(stack: Stack, sim: SimAdmin) -> None:
    """Verify waits for a guest at most ``server_guest_slot_s`` in one claim, then snoozes (attempt
    given back) and looks again: guests that never come up do not hold the region's executor slots
    for ``server_guest_ready_s`` (15 min each; a few of them held all eight and every other
    tenant's job, a delete's included, stayed pending)."""
    await sim._req("POST", "/guest-faults", json={"kind": "agent_never_starts", "name": "stuck"})
    server, job = await stack.create_server("stuck")

    async def snoozed() -> dict[str, Any] | None:
        got = await stack.job(job["id"])
        return got if got["status"] == "retry" and got["attempt"] <= 1 else None

    got = await wait_until(snoozed, 60, "the create to snooze on its guest")
    assert "looked into again" in (got.get("error") or {}).get("message", ""), got
    # meanwhile another server's create runs to the end
    other, other_job = await stack.create_server("fine")
    assert (await stack.wait_job(other_job["id"], timeout_s=60))["status"] == "succeeded"
    assert (await stack.server(server["id"]))["status"] == "creating"
