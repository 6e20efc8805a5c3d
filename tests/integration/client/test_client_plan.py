"""``z9 <kind> plan ID`` from the client against the real stack: exit codes as ``terraform plan
-detailed-exitcode`` (0 in sync, 2 drift, 1 error), ``-o json`` printing the API's own shape, the table
naming the drift and each step (a disruptive one said so, any other "not interrupted"); ``plan`` offered
for exactly the types the API has a plan route for."""
from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

from tests.integration.client.test_client import CREATE, client_env, z9
from tests.integration.servers.test_server_plan import _pve
from tests.support import SimAdmin, Stack
from z9.client.cli import USAGE


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
    assert "not interrupted" in out, out  # the guest column says so, as the console does

    code, out, err = await z9("servers", "plan", "srv_01jd3x5v8q2m6n4p7r9s1t3w5y", env=env)
    assert code == 1 and "not_found" in err, (out, err)


def _verbs(parser: argparse.ArgumentParser, group: str) -> set[str]:
    def sub(p: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
        return next(a.choices for a in p._actions if isinstance(a, argparse._SubParsersAction))
    return set(sub(sub(parser)[group]))


def test_plan_is_offered_for_exactly_the_types_with_a_plan_route() -> None:
    """``z9 <plural> plan`` exists where the API's document has ``POST /v1/<plural>/{id}/actions/plan``
    (a type with ``ResourceType.plan_of``): not for networks nor firewalls (the route would 404)."""
    from z9.api.app import operations

    from z9 import resources
    from z9.cli import build_parser

    routes = {op.path.split("/")[1] for op in operations() if op.path.endswith("/actions/plan")}
    parser = build_parser()
    offered = {rt.plural for rt in resources.types() if "plan" in _verbs(parser, rt.plural)}
    assert offered == routes == {rt.plural for rt in resources.types() if rt.plan_of is not None}
    assert {"networks", "firewalls"} & offered == set() and {"servers", "volumes"} <= offered


async def test_plan_of_a_type_without_a_plan_route_is_a_usage_error(stack: Stack, tmp_path: Path) -> None:
    env = client_env(stack, tmp_path)
    for plural in ("networks", "firewalls"):
        code, out, err = await z9(plural, "plan", "net_01jd3x5v8q2m6n4p7r9s1t3w5y", env=env)
        assert code == USAGE and "invalid choice: 'plan'" in err, (plural, code, out, err)
