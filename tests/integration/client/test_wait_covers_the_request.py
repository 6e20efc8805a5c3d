"""A create's answer names every job the request made (``jobs``, ``job`` first), and ``--wait``
follows them all: "wait" means what was asked for is in place. A server asked for with a public
address is a ServerCreate and an AddressAssign (the address into the VM's IP filter set, after the
VM exists); the wait returns once both have succeeded, not when ServerCreate alone has (the
server would not yet be reachable at its address). Load balancers, clusters and addresses make
one job per create, which covers what was asked for (their VMs configured and verified): their
``jobs`` is ``[job]``."""
from __future__ import annotations

import json
from pathlib import Path

from tests.support import REGION, SimAdmin, Stack
from tests.integration.client.test_client import CREATE, client_env, z9


async def test_a_create_answers_every_job_it_made(api: Stack) -> None:
    status, out = await api.call("POST", "/servers", json={"name": "two-jobs", "region": REGION, "image": "debian-12",
                                                           "cores": 1, "memory_mib": 1024, "disk_gib": 10,
                                                           "public_ipv4": True})
    assert status == 202, out
    assert out["jobs"][0] == out["job"] and [j["kind"] for j in out["jobs"]] == ["ServerCreate", "AddressAssign"]
    assign = await api.job(out["jobs"][1]["id"])
    assert assign["resource"] == {"type": "address", "id": out["server"]["public_ipv4"]["id"]}
    status, out = await api.call("POST", "/servers", json={"name": "one-job", "region": REGION, "image": "debian-12",
                                                           "cores": 1, "memory_mib": 1024, "disk_gib": 10})
    assert status == 202 and out["jobs"] == [out["job"]], out
    status, out = await api.call("POST", "/addresses", json={"region": REGION, "name": "www"})
    assert status == 202 and out["jobs"] == [out["job"]], out


async def test_public_ipv4_create_wait_returns_with_the_address_held(stack: Stack, sim: SimAdmin,
                                                                    tmp_path: Path) -> None:
    # the AddressAssign's first write to the VM's IP set answers 3 s late: a wait that followed only
    # ServerCreate would return while it is still running
    await sim.fault(method="POST", path=r"/firewall/ipset", action="delay", seconds=3.0, times=1)
    env = client_env(stack, tmp_path)
    code, out, err = await z9(*CREATE, "--name", "reachable", "--public-ipv4", "--wait", "-o", "json", env=env)
    assert code == 0, err
    server = json.loads(out)["server"]  # the API's own shape
    address = server["public_ipv4"]
    assert address is not None, server
    # at the wait's return: the address is the server's, active, and every job of the request succeeded
    status, got = await stack.call("GET", f"/addresses/{address['id']}")
    assert status == 200, got
    assert got["address"]["server_id"] == server["id"] and got["address"]["status"] == "active", got
    status, jobs = await stack.call("GET", f"/jobs?resource_id={address['id']}")
    assert status == 200, jobs
    assert [(j["kind"], j["status"]) for j in jobs["jobs"]] == [("AddressAssign", "succeeded")], jobs
    assert "AddressAssign" in err, err  # the wait said what it followed
