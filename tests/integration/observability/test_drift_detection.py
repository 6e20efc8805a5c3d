"""Periodic drift detection: the reaper's read-only plans (z9.reaper.drift) record each resource's drift
state (resource_drift, migration 0028), set z9_resources_drifted{kind} and its oldest age, and the
operator's GET /v1/operator/drift lists the drifted resources — against the simulator over HTTPS, with
no Proxmox write (the simulator's request log)."""
from __future__ import annotations

import asyncio
import secrets
from typing import Any

import pytest
from z9.common import metrics, store
from z9.reaper.drift import DriftChecker

from tests.integration.servers.test_server_plan import _converge, _pve
from tests.support import SimAdmin, Stack

# every pass checks every live resource again (0 is off)
pytestmark = pytest.mark.settings(drift_interval_s=0.001)


def _gauge(g: Any, kind: str) -> float:
    return g.labels(kind)._value.get()


async def _drift_view(api: Stack) -> list[dict[str, Any]]:
    op = "z9t_" + secrets.token_urlsafe(24)
    await store.api_token_insert(api.pool, api.tenant_id, op, "ops", scopes=["read", "write", "operator"])
    status, out = await api.call("GET", "/operator/drift?kind=server", token=op)
    assert status == 200, out
    return out["resources"]


async def test_the_reaper_records_drift_exports_it_and_lists_it(api: Stack, sim: SimAdmin) -> None:
    await api.start_service("executor")
    server, job = await api.create_server("drifty")
    assert (await api.wait_job(job["id"]))["status"] == "succeeded"
    server = await api.server(server["id"])
    checker = DriftChecker(api.settings)
    try:
        seen = len(await sim.requests())
        assert await checker.run_once(api.pool) == 1
        row = await api.pool.fetchrow("SELECT * FROM resource_drift WHERE resource_id = $1", server["id"])
        assert row["in_sync"] is True and row["drifted_since"] is None and row["job_kind"] == "ServerCreate"
        assert _gauge(metrics.RESOURCES_DRIFTED, "server") == 0
        assert await _drift_view(api) == []

        vmid, node = server["observed"]["vmid"], server["observed"]["node"]
        await asyncio.to_thread(lambda: _pve(sim).nodes(node).qemu(vmid).config.put(cores=4))
        seen = len(await sim.requests())
        assert await checker.run_once(api.pool) == 1
        assert await checker.run_once(api.pool) == 1  # still drifted: drifted_since kept
        assert [r for r in (await sim.requests())[seen:] if r["method"] != "GET"] == []
        row = await api.pool.fetchrow("SELECT * FROM resource_drift WHERE resource_id = $1", server["id"])
        assert row["in_sync"] is False and row["drifted_since"] is not None and row["drifted_since"] < row["checked_at"]
        assert _gauge(metrics.RESOURCES_DRIFTED, "server") == 1
        assert _gauge(metrics.RESOURCES_DRIFTED_OLDEST, "server") >= 0
        listed = await _drift_view(api)
        assert [(r["id"], r["drift"]) for r in listed] == [
            (server["id"], [{"path": "config.cores", "want": 2, "have": 4}])]
        assert [s["name"] for s in listed[0]["steps"]] == ["configure"]

        assert (await _converge(api, server["id"]))["status"] == "succeeded"
        assert await checker.run_once(api.pool) == 1
        row = await api.pool.fetchrow("SELECT * FROM resource_drift WHERE resource_id = $1", server["id"])
        assert row["in_sync"] is True and row["drifted_since"] is None
        assert _gauge(metrics.RESOURCES_DRIFTED, "server") == 0
        assert await _drift_view(api) == []
    finally:
        checker.close()


@pytest.mark.settings(drift_interval_s=0)
async def test_drift_detection_off_plans_nothing(api: Stack, sim: SimAdmin) -> None:
    await api.start_service("executor")
    _, job = await api.create_server("quiet")
    assert (await api.wait_job(job["id"]))["status"] == "succeeded"
    checker = DriftChecker(api.settings)
    try:
        assert await checker.run_once(api.pool) == 0
        assert await api.pool.fetchval("SELECT count(*) FROM resource_drift") == 0
    finally:
        checker.close()
