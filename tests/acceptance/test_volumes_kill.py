"""Volume jobs with their executor SIGKILLed mid-step (real executor processes, real PostgreSQL, the
simulator over HTTPS): killed in an attach's reassign, a detach's unplug or its reassign, the next executor
resumes from what exists — the disk ends attached once, to one VM, and no unusedN is left on any VM."""
from __future__ import annotations


import pytest

from z9.resources import volume as vol
from z9.resources.server import store as server_store

from tests.support import REGION, Services, SimAdmin, Stack, wait_until


async def _server(stack: Stack, name: str) -> dict:
    server, job = await stack.create_server(name)
    assert (await stack.wait_job(job["id"], timeout_s=90))["status"] == "succeeded"
    return await stack.server(server["id"])


def _holders(state: dict, serial: str, volids: set[str]) -> tuple[list[int], list[tuple[int, str]]]:
    """(VMs whose config has a drive with the serial, every unusedN of any VM naming one of ``volids``
    or any volume disk)."""
    holding = sorted(v["vmid"] for v in state["vms"] if any(f"serial={serial}" in str(x) for x in v["config"].values()))
    unused = [(v["vmid"], k) for v in state["vms"] for k in v["config"] if k.startswith("unused")]
    return holding, unused


@pytest.mark.parametrize("kill_in", ["attach:qmmove", "detach:qmconfig", "detach:qmmove"])
async def test_sigkill_mid_step_resumes_from_what_exists(api: Stack, sim: SimAdmin, services: Services,
                                                         kill_in: str) -> None:
    action, task = kill_in.split(":")
    services.start("scheduler")
    first = services.start("executor")
    a, b = await _server(api, "ka"), await _server(api, "kb")
    status, out = await api.call("POST", "/volumes", json={"name": "k", "region": REGION, "size_gib": 2,
                                                            "server_id": a["id"]})
    assert status == 202, out
    vid = out["volume"]["id"]
    assert (await api.wait_job(out["job"]["id"], timeout_s=90))["status"] == "succeeded"
    serial = vol.serial_of(vid)

    before = (await sim.counters())["tasks_started"].get(task, 0)
    await sim.hold_tasks(task)  # the task runs until released: the kill lands inside it
    if action == "attach":
        status, out = await api.call("POST", f"/volumes/{vid}/actions/detach")
        assert status == 202, out
        await sim.release_tasks(task)
        assert (await api.wait_job(out["job"]["id"], timeout_s=90))["status"] == "succeeded"
        await sim.hold_tasks(task)
        before = (await sim.counters())["tasks_started"].get(task, 0)
        status, out = await api.call("POST", f"/volumes/{vid}/actions/attach", json={"server_id": b["id"]})
        final = b["observed"]["vmid"]
    else:
        status, out = await api.call("POST", f"/volumes/{vid}/actions/detach")
        final = None
    assert status == 202, out
    job_id = out["job"]["id"]

    async def started() -> bool:
        return (await sim.counters())["tasks_started"].get(task, 0) > before
    await wait_until(started, 60, f"the {action}'s {task} task to start")
    await first.kill()
    services.start("executor")
    await sim.release_tasks(task)
    done = await api.wait_job(job_id, timeout_s=90)
    assert done["status"] == "succeeded", done
    assert done["attempt"] >= 2

    row = await vol.get(api.pool, vid)
    assert row is not None
    holding, unused = _holders(await sim.state(), serial, set())
    anchor = (row.observed or {}).get("anchor") or {}
    if final is None:
        assert row.status == "available" and holding == [anchor["vmid"]], (row, holding)
    else:
        assert row.status == "attached" and holding == [final], (row, holding)   # once, to one VM
    assert unused == [], unused                                                 # no unused orphan
    assert (await server_store.server_get(api.pool, a["id"])) is not None
