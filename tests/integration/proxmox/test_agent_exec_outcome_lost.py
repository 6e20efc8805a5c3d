"""``ProxmoxClient.agent_exec`` (what the cluster runs in its guests) when an answer is lost: the ``exec`` POST
performed with its answer dropped, or the ``exec-status`` answer that said ``exited`` dropped — qemu-ga then
forgets the pid, and asking again answers ``Invalid parameter 'pid'`` (qemu-guest-agent's guest-exec-status
removes the process once it reported its exit). The command is run again within the call (every command z9
runs through it may run twice), and an agent answering "QEMU guest agent is not running" once is asked again.
Before, each of these ended the job's attempt. Against the simulator over HTTPS."""
from __future__ import annotations

from collections.abc import Iterator

import pytest
from z9.common.settings import RegionSettings
from z9.executor.proxmox import AgentUnavailable, ProxmoxClient

from tests.support import SimAdmin, wait_until

_OPEN: list[ProxmoxClient] = []


@pytest.fixture(autouse=True)
def _close_clients() -> Iterator[None]:
    yield
    while _OPEN:
        _OPEN.pop().close()


def _client(sim: SimAdmin) -> ProxmoxClient:
    srv = sim.server
    c = ProxmoxClient("dev-1", RegionSettings(url=srv.url, token_id=srv.token_id, token_secret=srv.token_secret,
                                              verify_ssl=str(srv.cert_path), request_timeout_s=10))
    _OPEN.append(c)
    return c


async def _running_guest(pve: ProxmoxClient, vmid: int) -> None:
    await pve.wait_task(await pve.clone("pve1", 9000, newid=vmid, name=f"g{vmid}", description="t"),
                        deadline_s=30, poll_s=0.05)
    await pve.wait_task(await pve.start("pve1", vmid), deadline_s=30, poll_s=0.05)

    async def agent_answers() -> bool:
        try:
            await pve.agent_ping("pve1", vmid)
            return True
        except AgentUnavailable:
            return False
    await wait_until(agent_answers, 30, "the guest agent to answer")


async def _execs(sim: SimAdmin) -> int:
    return sum(r["count"] for r in (await sim.counters())["requests"]
               if r["method"] == "POST" and r["path"].endswith("/agent/exec"))


@pytest.mark.parametrize("lost", ["exec", "exec-status"])
async def test_a_command_whose_outcome_is_lost_is_run_again(sim: SimAdmin, lost: str) -> None:
    pve = _client(sim)
    await _running_guest(pve, 210)
    before = await _execs(sim)
    await sim.fault(method="*", path=rf"/qemu/210/agent/{lost}$", action="drop", times=1)
    code, out, _ = await pve.agent_exec("pve1", 210, ["hostname"], poll_s=0.05)
    assert code == 0 and out.strip(), out
    assert await _execs(sim) - before == 2  # run once more: the first one's outcome was lost


async def test_an_agent_not_running_once_is_asked_again(sim: SimAdmin) -> None:
    pve = _client(sim)
    await _running_guest(pve, 211)
    sim.allow_rejections = True
    await sim.fault(method="POST", path=r"/qemu/211/agent/exec$", action="error", status=500,
                    reason="QEMU guest agent is not running", times=1)
    code, _, _ = await pve.agent_exec("pve1", 211, ["true"], poll_s=0.05)
    assert code == 0
