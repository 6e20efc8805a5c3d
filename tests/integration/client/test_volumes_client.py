"""``z9 volumes …`` from the client against the real stack (as a new user drives it): create → attach
--wait → resize → get (the device path by serial) → list with filters → detach → delete → restore,
``-o json`` printing the API's own shapes, and ``z9 quota show`` listing volume_gib."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.support import REGION, SimAdmin, Stack
from tests.integration.client.test_client import CREATE, client_env, z9


async def _ok(*args: str, env: dict[str, str]) -> Any:
    code, out, err = await z9(*args, "-o", "json", env=env, timeout_s=240)
    assert code == 0, (args, out, err)
    return json.loads(out)


async def test_volume_walkthrough_from_the_client(stack: Stack, sim: SimAdmin, tmp_path: Path) -> None:
    env = client_env(stack, tmp_path)
    srv = (await _ok(*CREATE, "--name", "vol-web", "--wait", env=env))["server"]
    out = await _ok("volumes", "create", "--name", "data", "--region", REGION, "--size-gib", "2", "--label", "env=ci",
                    "--wait", env=env)
    assert set(out) == {"volume", "job"}, out
    vol = out["volume"]
    assert vol["status"] == "available" and out["job"]["kind"] == "VolumeCreate"

    out = await _ok("volumes", "attach", vol["id"], "--server", srv["id"], "--wait", env=env)
    assert out["job"]["kind"] == "VolumeAttach" and out["volume"]["status"] == "attached"
    out = await _ok("volumes", "resize", vol["id"], "--size-gib", "3", "--wait", env=env)
    assert out["volume"]["size_gib"] == 3 and out["volume"]["observed"]["size_gib"] == 3
    code, table, err = await z9("volumes", "get", vol["id"], env=env)
    assert code == 0 and "/dev/disk/by-id/scsi-0QEMU_QEMU_HARDDISK_z9" in table, (table, err)
    code, table, err = await z9("volumes", "list", "--server", srv["id"], "-l", "env=ci", env=env)
    assert code == 0 and vol["id"] in table and "3 GiB" in table, (table, err)

    code, out_, err = await z9("volumes", "attach", vol["id"], "--server", srv["id"], env=env)
    assert code == 3 and "volume_already_attached" in err + out_, (out_, err)   # a 409: the precondition
    code, out_, err = await z9("volumes", "resize", vol["id"], "--size-gib", "1", env=env)
    assert code == 3 and "size_gib" in err + out_, (out_, err)

    out = await _ok("volumes", "detach", vol["id"], "--wait", env=env)
    assert out["volume"]["status"] == "available" and out["volume"]["server_id"] is None
    out = await _ok("volumes", "delete", vol["id"], "--wait", env=env)
    assert out["volume"]["status"] == "deleting"
    out = await _ok("volumes", "restore", vol["id"], "--wait", env=env)
    assert out["volume"]["status"] == "available"

    quota = await _ok("quota", "show", env=env)
    assert quota["quotas"]["volume_gib"]["used"] == 3, quota

    # a server deleted with its volumes (z9 servers delete --delete-volumes: the option the volume type
    # declares on that route); the default keeps them, detached
    out = await _ok("volumes", "attach", vol["id"], "--server", srv["id"], "--wait", env=env)
    assert out["volume"]["status"] == "attached"
    out = await _ok("servers", "delete", srv["id"], "--delete-volumes", "--wait", env=env)
    assert out["server"]["status"] == "deleting"
    # every job the request made, finished: the server's stop and the volume's detach
    assert {(j["kind"], j["status"]) for j in out["jobs"]} >= {("VolumeDetach", "succeeded")}, out
    out = await _ok("volumes", "get", vol["id"], env=env)
    assert out["volume"]["status"] == "deleting" and out["volume"]["server_id"] is None, out
