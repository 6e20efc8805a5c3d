"""``z9 <kind> plan ID`` from the client against the real stack: exit codes as ``terraform plan
-detailed-exitcode`` (0 in sync, 2 drift, 1 error), ``-o json`` printing the API's own shape, the table
naming the drift and each step (a disruptive one said so)."""
from __future__ import annotations

import asyncio
import json
from pathlib import Path

from tests.integration.client.test_client import CREATE, client_env, z9
from tests.integration.servers.test_server_plan import _pve
from tests.support import SimAdmin, Stack


async def test_plan_exit_codes_and_outputs(stack: Stack, sim: SimAdmin, tmp_path: Path) -> None:
    env = client_env(stack, tmp_path)
    code, out, err = await z9(*CREATE, "--name", "plan-web", "--wait", "-o", "json", env=env, timeout_s=240)
    assert code == 0, (out, err)
    srv = json.loads(out)["server"]

    code, out, err = await z9("servers", "plan", srv["id"], "-o", "json", env=env)
    assert code == 0, (out, err)
    assert json.loads(out) == {"in_sync": True, "job_kind": "ServerCreate", "drift": [], "steps": [], "blocked_by": [],
                               "waiting": None}
    code, out, err = await z9("servers", "plan", srv["id"], env=env)
    assert code == 0 and "in sync" in out, (out, err)

    vmid, node = srv["observed"]["vmid"], srv["observed"]["node"]
    await asyncio.to_thread(lambda: _pve(sim).nodes(node).qemu(vmid).config.put(cores=4))
    code, out, err = await z9("servers", "plan", srv["id"], "-o", "json", env=env)
    assert code == 2, (out, err)
    assert json.loads(out)["drift"] == [{"path": "config.cores", "want": 1, "have": 4}]
    code, out, err = await z9("servers", "plan", srv["id"], env=env)
    assert code == 2 and "config.cores" in out and "step 1 configure" in out and "DISRUPTIVE" not in out, (out, err)

    code, out, err = await z9("servers", "plan", "srv_01jd3x5v8q2m6n4p7r9s1t3w5y", env=env)
    assert code == 1 and "not_found" in err, (out, err)
