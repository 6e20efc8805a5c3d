"""``z9 firewalls …`` from the client against the real stack (as a new user drives it): servers labelled at
create, a firewall opening 22 and 443 by label selector (``--wait``: applied after pve-firewall's cycle),
get/list tables, a refusal with its code, set-rules to none, remove, delete — ``-o json`` printing the
API's own shapes."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.integration.client.test_client import CREATE, client_env, z9
from tests.support import REGION, SimAdmin, Stack


async def _ok(*args: str, env: dict[str, str]) -> Any:
    code, out, err = await z9(*args, "-o", "json", env=env, timeout_s=240)
    assert code == 0, (args, out, err)
    return json.loads(out)


async def test_firewall_walkthrough_from_the_client(stack: Stack, sim: SimAdmin, tmp_path: Path) -> None:
    env = client_env(stack, tmp_path)
    web = (await _ok(*CREATE, "--name", "fw-web", "--label", "role=web", "--wait", env=env))["server"]
    assert web["labels"] == {"role": "web"}
    out = await _ok("firewalls", "create", "--name", "web", "--region", REGION,
                    "--rule", "in:tcp:22:0.0.0.0/0,::/0#ssh", "--rule", "in:tcp:443:0.0.0.0/0,::/0",
                    "--selector", "role=web", "--wait", env=env)
    fw = out["firewall"]
    assert out["job"]["kind"] == "FirewallCreate" and out["job"]["status"] == "succeeded", out
    assert [(r["port"], r["source_ips"], r["description"]) for r in fw["rules"]] == [
        ("22", ["0.0.0.0/0", "::/0"], "ssh"), ("443", ["0.0.0.0/0", "::/0"], None)]
    got = await _ok("firewalls", "get", fw["id"], env=env)
    assert [(m["server_id"], m["status"]) for m in got["firewall"]["members"]] == [(web["id"], "applied")], got
    code, table, err = await z9("firewalls", "get", fw["id"], env=env)
    assert code == 0 and f"{web['id']} applied" in table and "in tcp 22 0.0.0.0/0,::/0 (ssh)" in table, (table, err)
    code, table, err = await z9("firewalls", "list", "--region", REGION, env=env)
    assert code == 0 and fw["id"] in table and "selector role=web" in table, (table, err)

    # a refusal carries the API's code; a usage error never reaches it
    code, out_, err = await z9("firewalls", "apply", fw["id"], "--selector", "role=web", env=env)
    assert code == 3 and "firewall_already_applied" in out_ + err, (out_, err)
    code, out_, err = await z9("firewalls", "apply", fw["id"], env=env)
    assert code != 0 and "--server or --selector" in out_ + err, (out_, err)
    code, out_, err = await z9("firewalls", "create", "--name", "bad", "--region", REGION, "--rule", "sideways", env=env)
    assert code != 0 and "DIRECTION:PROTOCOL:PORT:ADDRESSES" in out_ + err, (out_, err)

    out = await _ok("firewalls", "set-rules", fw["id"], "--wait", env=env)
    assert out["firewall"]["rules"] == [] and out["job"]["kind"] == "FirewallSetRules"
    out = await _ok("firewalls", "remove", fw["id"], "--selector", "role=web", "--wait", env=env)
    assert out["job"]["status"] == "succeeded"
    assert (await _ok("firewalls", "get", fw["id"], env=env))["firewall"]["members"] == []
    out = await _ok("firewalls", "delete", fw["id"], "--wait", env=env)
    assert out["job"]["kind"] == "FirewallDelete" and out["job"]["status"] == "succeeded"
