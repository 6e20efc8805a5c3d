"""What makes a plan read-only, without a network: the read-only Proxmox client refuses every request but a
GET before it is sent (a guest-agent ``exec`` only for a command its caller marks as a read), and a plan's
context refuses every write a job makes."""
from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from z9.common.models import Job
from z9.common.settings import RegionSettings, Settings
from z9.executor.context import Step
from z9.executor.preview import PlanContext
from z9.executor.proxmox import ProxmoxClient, ReadOnlyRefused

REGION = RegionSettings(url="https://127.0.0.1:1", token_id="root@pam!plan", token_secret="s", verify_ssl=False)


@pytest.fixture
def client() -> Iterator[ProxmoxClient]:
    c = ProxmoxClient("r1", REGION, max_threads=1, read_only=True)
    yield c
    c.close()


async def test_the_read_only_client_sends_no_write(client: ProxmoxClient) -> None:
    with pytest.raises(ReadOnlyRefused, match="POST /nodes/{node}/qemu/{vmid}/status/start"):
        await client.start("pve1", 100)
    with pytest.raises(ReadOnlyRefused, match="PUT"):
        await client.configure_now("pve1", 100, {"cores": 2}, digest=None)
    with pytest.raises(ReadOnlyRefused, match="DELETE"):
        await client.destroy("pve1", 100)
    with pytest.raises(ReadOnlyRefused, match="agent/exec"):  # a command not marked as a read
        await client.agent_exec("pve1", 100, ["reboot"])


def _job() -> Job:
    now = datetime.now(UTC)
    return Job(id="job_plan", seq=0, kind="ServerCreate", region="r1", tenant_id="ten_x", resource_type="server",
               resource_id="srv_x", args={}, status="running", attempt=1, max_attempts=1, run_after=now,
               lease_owner="plan", lease_expires_at=None, steps=[], memo={}, error=None, trace_context=None,
               created_at=now, started_at=now, finished_at=None, updated_at=now)


async def test_a_plans_context_refuses_every_write_of_a_job(client: ProxmoxClient) -> None:
    ctx = PlanContext(_job(), object(), client, Settings(regions={"r1": REGION}))
    assert ctx.read_only
    for write in (ctx.fence(), ctx.remember(vmid=1), ctx.set_plan([Step("x")]), ctx.step_running(Step("x")),
                  ctx.succeed(None, None)):
        with pytest.raises(ReadOnlyRefused, match="a plan writes nothing"):
            await write
