"""How many Proxmox requests each operation makes, counted in the simulator's request log by the
operation's own fencing token (every request a job sends carries ``X-Z9-Lease: <job>/<attempt>/
<owner>``), and held to a budget. Task and exec-status polls are counted too: how often a task is
polled depends on how long it took (z9's first poll waits about as long as that took lately), so the
figures are taken after one warm-up of the same operation.

``bench/pve_requests.py`` runs this file and prints the figures (``Z9_REQUEST_FIGURES=<file>``: one
JSON line per operation appended there); ``bench/README.md`` has them, before and after the cuts."""
from __future__ import annotations

import collections
import json
import os
from typing import Any

from tests.guest_tools import require_guest_tools
from tests.integration.load_balancers.test_load_balancers import LB_TEMPLATE, SERVICE
from tests.support import REGION, SimAdmin, Stack, wait_until

# The budgets: the requests of one operation that do work or read the world (``work``), without
# the polls of a task, a guest command or a booting agent, whose number follows how long those took
# (machine load: they are printed, not held). The goals for the whole operation beside them.
# Measured (2026-12-08, 6 runs): server 15, address 14, volume 13 every time; lb-small 39–41 and a
# cluster 41–42, whose waits repeat a command or a read while a guest boots or a snapshot lags (a
# `cloud-init status` asked again, a VM read again when the listing disagreed): those two have a margin
# for that, as the periodic observe has. A volume attach: 14 once merged with the volume's recorded
# volids and the create ledger (one more VM read per attach, not yet traced to its step).
BUDGET = {"server_create": 15, "address_attach": 14, "volume_attach": 14, "lb_small_create": 46,
          "cluster_create_1cp": 48, "lb_observe": 8}
GOAL = {"server_create": 15, "address_attach": 10, "volume_attach": 10, "lb_small_create": 30,
        "cluster_create_1cp": 40}
POLLS = {("GET", "/nodes/{node}/tasks/{upid}/status"), ("GET", "/nodes/{node}/qemu/{vmid}/agent/exec-status"),
         ("POST", "/nodes/{node}/qemu/{vmid}/agent/ping")}


async def _per_job(sim: SimAdmin, job_ids: list[str]) -> collections.Counter[tuple[str, str]]:
    """The requests the jobs sent, per (method, path template), every attempt of each
    (``Z9_REQUEST_SEQUENCE=1``: printed in order)."""
    out: collections.Counter[tuple[str, str]] = collections.Counter()
    for jid in job_ids:
        for r in await sim.requests(lease=jid):
            out[(r["method"], r["path"])] += 1
            if os.environ.get("Z9_REQUEST_SEQUENCE"):
                print("   ", r["method"], r["path"])
    return out


def _report(op: str, used: collections.Counter[tuple[str, str]]) -> int:
    """Print the operation's figures (and append them to ``$Z9_REQUEST_FIGURES``); its work requests."""
    polls = sum(n for k, n in used.items() if k in POLLS)
    total = sum(used.values())
    line = {"operation": op, "requests": total, "polls": polls, "work": total - polls, "budget_work": BUDGET[op],
            "goal": GOAL.get(op), "by_path": {f"{m} {p}": n for (m, p), n in sorted(used.items())}}
    print(json.dumps(line))
    if os.environ.get("Z9_REQUEST_FIGURES"):
        with open(os.environ["Z9_REQUEST_FIGURES"], "a") as f:
            f.write(json.dumps(line) + "\n")
    return total - polls


async def _server(stack: Stack, name: str, **over: Any) -> tuple[dict, str]:
    server, job = await stack.create_server(name, **over)
    done = await stack.wait_job(job["id"], timeout_s=90)
    assert done["status"] == "succeeded", done
    return await stack.server(server["id"]), job["id"]


async def test_a_server_create(stack: Stack, sim: SimAdmin) -> None:
    await _server(stack, "warm")  # the executor learns how long each task takes
    _, jid = await _server(stack, "counted")
    assert _report("server_create", await _per_job(sim, [jid])) <= BUDGET["server_create"]


async def test_an_address_attach(stack: Stack, sim: SimAdmin) -> None:
    used = []
    for name in ("warm", "counted"):
        server, _ = await _server(stack, name)
        status, out = await stack.call("POST", "/addresses", json={"region": REGION, "server_id": server["id"]})
        assert status == 202, out
        done = await stack.wait_job(out["job"]["id"], timeout_s=60)
        assert done["status"] == "succeeded", done
        used.append(await _per_job(sim, [out["job"]["id"]]))
    assert _report("address_attach", used[-1]) <= BUDGET["address_attach"]


async def test_a_volume_attach(stack: Stack, sim: SimAdmin) -> None:
    used = []
    for name in ("warm", "counted"):
        server, _ = await _server(stack, name)
        status, out = await stack.call("POST", "/volumes", json={"name": f"v-{name}", "region": REGION, "size_gib": 1})
        assert status == 202, out
        assert (await stack.wait_job(out["job"]["id"], timeout_s=60))["status"] == "succeeded"
        vid = out["volume"]["id"]
        status, out = await stack.call("POST", f"/volumes/{vid}/actions/attach", json={"server_id": server["id"]})
        assert status == 202, out
        done = await stack.wait_job(out["job"]["id"], timeout_s=60)
        assert done["status"] == "succeeded", done
        used.append(await _per_job(sim, [out["job"]["id"]]))
    assert _report("volume_attach", used[-1]) <= BUDGET["volume_attach"]


async def test_an_lb_small_create_and_its_rest(stack: Stack, sim: SimAdmin) -> None:
    require_guest_tools()
    await sim._req("POST", "/vms", json=LB_TEMPLATE)
    used = []
    lb = None
    for name in ("warm", "counted"):
        status, out = await stack.call("POST", "/load-balancers", json={
            "region": REGION, "name": f"lb-{name}", "type": "lb-small", "services": [SERVICE]})
        assert status == 202, out
        done = await stack.wait_job(out["job"]["id"], timeout_s=120)
        assert done["status"] == "succeeded", done
        used.append(await _per_job(sim, [out["job"]["id"]]))
        lb = out["load_balancer"]
    assert _report("lb_small_create", used[-1]) <= BUDGET["lb_small_create"]
    assert lb is not None
    # at rest: the reaper's periodic LoadBalancerObserve, every lb_health_interval_s (15 s by default)
    # per load balancer — what one of them costs, times 4 a minute, is the load balancer's rest load
    since = await stack.pool.fetchval("SELECT now()")

    async def observed() -> str | None:
        return await stack.pool.fetchval(
            "SELECT id FROM jobs WHERE kind = 'LoadBalancerObserve' AND resource_id = $1 AND status = 'succeeded' "
            "AND created_at > $2 ORDER BY created_at LIMIT 1", lb["id"], since)
    jid = await wait_until(observed, 60, "a periodic observe of the load balancer")
    assert _report("lb_observe", await _per_job(sim, [jid])) <= BUDGET["lb_observe"]


async def test_a_cluster_of_one_control_plane(stack: Stack, sim: SimAdmin) -> None:
    from tests.integration.clusters.test_clusters_e2e import K8S_TIMING

    await sim.configure(**K8S_TIMING)
    used = []
    for name in ("warm", "counted"):
        status, out = await stack.call("POST", "/clusters", json={
            "name": name, "region": REGION, "version": "1.33",
            "control_plane": {"count": 1, "cores": 2, "memory_mib": 2048, "disk_gib": 10}})
        assert status == 202, out
        done = await stack.wait_job(out["job"]["id"], timeout_s=120)
        assert done["status"] == "succeeded", done
        used.append(await _per_job(sim, [out["job"]["id"]]))
    assert _report("cluster_create_1cp", used[-1]) <= BUDGET["cluster_create_1cp"]

