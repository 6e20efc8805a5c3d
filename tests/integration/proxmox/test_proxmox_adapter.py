"""The hypervisor adapter and its task waiter against the simulator over HTTPS
(proxmox-api.md: UPIDs, `no such task`, read timeouts, WARNINGS, task logs, lost responses)."""
from __future__ import annotations

from typing import Iterator

import pytest

from z9.common.errors import PermanentError, TemporaryError
from z9.common.settings import RegionSettings
from z9.executor.proxmox import CALL_TRIES, OutcomeUnknown, ProxmoxClient, TaskFailed, Upid, VmidTaken, VmLocked

from tests.support import SimAdmin


_OPEN: list[ProxmoxClient] = []


@pytest.fixture(autouse=True)
def _close_clients() -> Iterator[None]:
    yield
    while _OPEN:
        _OPEN.pop().close()


def _client(sim: SimAdmin, timeout_s: float = 10.0) -> ProxmoxClient:
    srv = sim.server
    client = ProxmoxClient("dev-1", RegionSettings(url=srv.url, token_id=srv.token_id, token_secret=srv.token_secret,
                                                   verify_ssl=str(srv.cert_path), request_timeout_s=timeout_s))
    _OPEN.append(client)
    return client


async def _clone(pve: ProxmoxClient, newid: int) -> str:
    return await pve.clone("pve1", 9000, newid=newid, name=f"t{newid}", description="test")


async def test_wait_task_ok_and_upid_format(sim: SimAdmin) -> None:
    pve = _client(sim)
    upid = await _clone(pve, await pve.next_id())
    up = Upid.parse(upid)
    assert (up.node, up.type, up.id) == ("pve1", "qmclone", "9000")
    assert await pve.wait_task(upid, deadline_s=10, poll_s=0.05) == "OK"


async def test_warnings_count_as_success(sim: SimAdmin) -> None:
    pve = _client(sim)
    await sim.fault(method="POST", path=r"/clone$", action="fail_task", exitstatus="WARNINGS: 2")
    upid = await _clone(pve, 150)
    assert await pve.wait_task(upid, deadline_s=10, poll_s=0.05) == "WARNINGS: 2"


async def test_no_such_task_right_after_post_is_tolerated(sim: SimAdmin) -> None:
    await sim.configure(task_invisible_s=0.25)
    pve = _client(sim)
    upid = await _clone(pve, 151)
    assert await pve.wait_task(upid, deadline_s=10, poll_s=0.1) == "OK"


async def test_no_such_task_forever_is_temporary(sim: SimAdmin) -> None:
    pve = _client(sim)
    bogus = "UPID:pve1:00000001:00000002:6B000000:qmclone:9000:root@pam!z9:"
    with pytest.raises(TemporaryError, match="no such task"):
        await pve.wait_task(bogus, deadline_s=10, poll_s=0.01, max_unknown=3)


async def test_read_timeout_on_one_poll_does_not_abort_the_wait(sim: SimAdmin) -> None:
    pve = _client(sim, timeout_s=0.3)
    upid = await _clone(pve, 152)
    await sim.fault(method="GET", path=r"/tasks/.*/status$", action="delay", seconds=1.0, times=1)
    assert await pve.wait_task(upid, deadline_s=10, poll_s=0.05) == "OK"


async def test_failed_task_carries_its_log(sim: SimAdmin) -> None:
    pve = _client(sim)
    await sim.fault(method="POST", path=r"/clone$", action="fail_task",
                    exitstatus="can't lock file '/var/lock/qemu-server/lock-153.conf' - got timeout")
    upid = await _clone(pve, 153)
    with pytest.raises(TaskFailed) as e:
        await pve.wait_task(upid, deadline_s=10, poll_s=0.05)
    assert not isinstance(e.value, PermanentError)
    assert "got timeout" in str(e.value) and any("TASK ERROR" in line for line in e.value.log_tail)


async def test_deadline_then_wait_again_on_the_same_upid(sim: SimAdmin) -> None:
    await sim.configure(task_seconds={"qmclone": 1.0})
    pve = _client(sim)
    upid = await _clone(pve, 154)
    with pytest.raises(TemporaryError, match="still running"):
        await pve.wait_task(upid, deadline_s=0.2, poll_s=0.05)
    assert await pve.wait_task(upid, deadline_s=10, poll_s=0.05) == "OK"
    assert (await sim.counters())["tasks_started"]["qmclone"] == 1


async def test_errors_are_translated(sim: SimAdmin) -> None:
    sim.allow_rejections = True
    pve = _client(sim)
    await _clone(pve, 155)
    with pytest.raises(VmidTaken):
        await _clone(pve, 155)  # "config file already exists"
    await sim.fault(method="POST", path=r"/qemu/155/config$", action="error", status=500,
                    reason="VM is locked (backup)")
    with pytest.raises(VmLocked):
        await pve.configure("pve1", 155, {"cores": 2}, digest=None)
    assert await pve.vm_state("pve2", 9000) is None  # config not on that node
    with pytest.raises(PermanentError):  # schema: 400 Parameter verification failed
        await pve.configure("pve1", 100, {"tags": "Bad Tag!"}, digest=None)
    # a passing 596 (pveproxy lost the node) is tried again within the call; one that lasts is
    # a TemporaryError after CALL_TRIES tries
    await sim.fault(method="GET", path=r"^/cluster/nextid$", action="error", status=596, reason="Broken pipe")
    assert await pve.next_id() >= 100
    await sim.fault(method="GET", path=r"^/cluster/nextid$", action="error", status=596, reason="Broken pipe",
                    times=CALL_TRIES)
    with pytest.raises(TemporaryError):
        await pve.next_id()


async def test_a_mutation_is_tried_again_only_when_pve_did_not_perform_it(sim: SimAdmin) -> None:
    """503 / a flock timeout: PVE did nothing, the call is sent again (bounded); a generic 500 on
    a mutation is an answer about the request (not sent again)."""
    sim.allow_rejections = True
    pve = _client(sim)
    await sim.fault(method="POST", path=r"/qemu/100/config$", action="error", status=503, reason="Service Unavailable")
    await sim.fault(method="POST", path=r"/qemu/100/config$", action="error", status=500,
                    reason="can't lock file '/var/lock/qemu-server/lock-100.conf' - got timeout")
    assert (await pve.configure("pve1", 100, {"description": "x"}, digest=None)).startswith("UPID:")
    await sim.fault(method="POST", path=r"/qemu/100/config$", action="error", status=500, reason="something broke")
    with pytest.raises(TemporaryError, match="something broke"):
        await pve.configure("pve1", 100, {"description": "y"}, digest=None)
    posts = [r for r in (await sim.counters())["requests"]
             if r["method"] == "POST" and r["path"] == "/nodes/{node}/qemu/{vmid}/config"]
    assert sum(r["count"] for r in posts) == 4  # 503, flock timeout, the one performed, the 500


async def test_dropped_response_is_outcome_unknown_while_the_action_happened(sim: SimAdmin) -> None:
    pve = _client(sim)
    await sim.fault(method="POST", path=r"/clone$", action="drop")
    with pytest.raises(OutcomeUnknown):
        await _clone(pve, 156)
    assert await sim.vm(156) is not None
