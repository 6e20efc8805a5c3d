"""The resource layer is generic: a second resource type — here a test-only ``widget`` with an
immediate deletion, its own table and status enum — gets the lifecycle queries, the scheduler's
failure rule, the reaper and the five generic API routes (and the OpenAPI document) by
registering, without a line of type-specific code in the scheduler, the reaper or the API."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, AsyncIterator

import asyncpg
import pytest
from pydantic import BaseModel, ConfigDict, Field, StrictStr

from z9.common import store
from z9 import resources
from z9.resources import Buffered, Immediate, ResourceType
from z9.resources.server import SERVER
from z9.common.clock import TestClock
from z9.common.store import Lease, NewJob
from z9.reaper import Reaper
from z9.scheduler import Scheduler

from tests.support import REGION, Stack, api_stack, make_tenant
from z9.resources.server import store as server_store

WIDGETS_DDL = """
CREATE TYPE widget_status AS ENUM ('creating', 'ready', 'deleting', 'destroying', 'deleted', 'failed');
CREATE TABLE widgets (
    id text PRIMARY KEY, tenant_id text NOT NULL REFERENCES tenants (id), region text NOT NULL,
    name text NOT NULL, colour text NOT NULL,
    status widget_status NOT NULL DEFAULT 'creating', status_reason text, status_before_delete widget_status,
    delete_after timestamptz, observed_at timestamptz, created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(), deleted_at timestamptz,
    labels jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(labels) = 'object'),
    CHECK (status <> 'deleting' OR delete_after IS NOT NULL),
    CHECK ((status = 'deleted') = (deleted_at IS NOT NULL)));
CREATE INDEX widgets_deletion_due ON widgets (delete_after) WHERE status = 'deleting';
"""


@dataclass
class Widget:
    id: str
    tenant_id: str
    region: str
    name: str
    colour: str
    status: str
    status_reason: str | None
    status_before_delete: str | None
    delete_after: datetime | None
    observed_at: datetime | None
    created_at: datetime
    updated_at: datetime
    deleted_at: datetime | None

    @classmethod
    def from_record(cls, r: Any) -> "Widget":
        return cls(**{k: r[k] for k in cls.__dataclass_fields__})

    def public(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "region": self.region, "colour": self.colour,
                "status": self.status, "status_reason": self.status_reason}


def _widget_type(deletion: Buffered | Immediate) -> ResourceType[Widget]:
    # (a type brings its own id prefix: registered, "wdg" ids are ids like any other)
    return ResourceType(name="widget", prefix="wdg", table="widgets", model=Widget,
                        kinds=("WidgetCreate", "WidgetDelete"), deletion=deletion,
                        statuses=("creating", "ready", "deleting", "destroying", "deleted", "failed"),
                        restore=lambda w: ("WidgetCreate", {"colour": w.colour}))


@pytest.fixture
async def widgets(pool: asyncpg.Pool) -> AsyncIterator[ResourceType[Widget]]:
    await pool.execute(WIDGETS_DDL)
    rtype = resources.register(_widget_type(Immediate(final_kind="WidgetDelete")))
    try:
        yield rtype
    finally:
        resources.REGISTRY.pop("widget", None)


async def _insert(pool: asyncpg.Pool, tenant: str, name: str = "w1") -> Widget:
    from z9.common.ids import new_id

    row = await pool.fetchrow("INSERT INTO widgets (id, tenant_id, region, name, colour) VALUES ($1, $2, $3, $4, 'red') "
                              "RETURNING *", new_id("wdg"), tenant, REGION, name)
    return Widget.from_record(row)


def test_registry_refuses_a_type_that_breaks_the_lifecycle_contract() -> None:
    with pytest.raises(ValueError, match="status 'destroying' missing"):
        ResourceType(name="bad", prefix="lb", table="bads", model=Widget, kinds=(), statuses=("deleting",),
                     deletion=Immediate("X"))
    with pytest.raises(ValueError, match="not a plain identifier"):
        ResourceType(name="bad", prefix="lb", table="bads; DROP TABLE jobs", model=Widget, kinds=(),
                     statuses=("deleting", "destroying", "deleted", "failed"), deletion=Immediate("X"))
    with pytest.raises(ValueError, match="restore job"):
        ResourceType(name="bad", prefix="lb", table="bads", model=Widget, kinds=(),
                     statuses=("deleting", "destroying", "deleted", "failed"), deletion=Buffered("A", "B"))
    for prefix in ("Bad", "b_d", "toolong", "job"):  # not 2-4 lower-case characters, or a generic prefix
        with pytest.raises(ValueError, match="id prefix"):
            ResourceType(name="bad", prefix=prefix, table="bads", model=Widget, kinds=(),
                         statuses=("deleting", "destroying", "deleted", "failed"), deletion=Immediate("X"))
    with pytest.raises(ValueError, match="share a prefix or a table"):
        resources.register(ResourceType(name="srv2", prefix="srv", table="srv2", model=Widget, kinds=(),
                                        statuses=("deleting", "destroying", "deleted", "failed"),
                                        deletion=Immediate("X")))


async def test_lifecycle_queries_serve_a_second_type(pool: asyncpg.Pool, widgets: ResourceType[Widget],
                                                     settings: Any) -> None:
    tenant, _ = await make_tenant(pool, "acme")
    w = await _insert(pool, tenant)
    # immediate deletion: straight to destroying, remembering the status before
    gone = await widgets.mark_deleting(pool, w.id, tenant, 600.0)
    assert gone is not None and gone.status == "destroying" and gone.status_before_delete == "creating"
    assert gone.delete_after is None
    assert await widgets.mark_deleting(pool, w.id, tenant, 600.0) is None  # not deletable twice
    assert await widgets.cancel_deletion(pool, w.id, tenant) is None  # nothing to cancel
    # a failed job other than the final one leaves the deletion going; the final one ends it
    await widgets.mark_failed_by_job(pool, w.id, "flaky", kind="WidgetCreate")
    assert (await widgets.get(pool, w.id)).status == "destroying"
    # the scheduler's reclaim dispatches by jobs.resource_type, whatever the type
    job = await store.job_insert(pool, widgets.new_job(gone, "WidgetDelete", max_attempts=1))
    clock = TestClock()
    [claimed] = await store.job_claim(pool, [REGION], 1, "ghost", 30.0, now=clock.db_now())
    assert claimed.id == job.id
    clock.step(31)  # the ghost's lease expires
    sched = Scheduler(settings, clock=clock)
    sched.pool = pool
    assert (await sched.run_once()).reclaimed_failed == 1
    failed = await widgets.get(pool, w.id, tenant)
    assert failed.status == "failed" and "expired" in failed.status_reason
    # observed: a status moves only from the statuses given, and clears the reason
    assert (await widgets.observed(pool, w.id, status="ready", from_statuses=("creating",))).status == "failed"
    ready = await widgets.observed(pool, w.id, status="ready", from_statuses=("failed",))
    assert ready.status == "ready" and ready.status_reason is None and ready.observed_at is not None
    # deleted only from destroying; its clone requests go with it
    assert not await widgets.deleted(pool, w.id)
    await widgets.mark_deleting(pool, w.id, tenant, 0.0)
    await store.job_insert(pool, widgets.new_job(w, "WidgetDelete"))
    [j2] = await store.job_claim(pool, [REGION], 1, "w", 30.0)
    await store.vm_clone_sent(pool, Lease(j2.id, "w", j2.attempt), w.id, "main", 120, "pve1")
    assert await widgets.deleted(pool, w.id)
    assert (await widgets.get(pool, w.id)).status == "deleted"
    assert await store.vm_clone_requests(pool, w.id) == []
    # listing, scoped to the tenant and filtered by status
    await _insert(pool, tenant, "w2")
    assert [x.name for x in await widgets.list(pool, tenant, status="creating")] == ["w2"]
    assert [x.name for x in await widgets.list(pool, tenant)] == ["w1", "w2"]
    assert await widgets.list(pool, (await make_tenant(pool, "other"))[0]) == []


async def test_reaper_serves_every_buffered_type(pool: asyncpg.Pool, settings: Any) -> None:
    await pool.execute(WIDGETS_DDL)
    rtype = resources.register(_widget_type(Buffered(first_kind="WidgetCreate", final_kind="WidgetDelete")))
    try:
        tenant, _ = await make_tenant(pool, "acme")
        w = await _insert(pool, tenant)
        s = await server_store.server_insert(pool, tenant_id=tenant, region=REGION, name="s", image="debian-12", cores=1,
                                      memory_mib=1024, disk_gib=4, ssh_keys=[])
        await rtype.mark_deleting(pool, w.id, tenant, 0.0)
        await SERVER.mark_deleting(pool, s.id, tenant, 0.0)
        reaper = Reaper(settings)
        reaper.pool = pool
        assert await reaper.run_once() == 2
        kinds = {r["resource_id"]: r["kind"] for r in await pool.fetch("SELECT resource_id, kind FROM jobs")}
        assert kinds == {w.id: "WidgetDelete", s.id: "ServerDelete"}
        assert (await rtype.get(pool, w.id)).status == "destroying"
    finally:
        resources.REGISTRY.pop("widget", None)


class WidgetCreate(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"name": "w1", "region": REGION,
                                                                             "colour": "red"}]})
    name: StrictStr = Field(pattern=r"^[a-z0-9-]{1,20}$")
    region: StrictStr
    colour: StrictStr = Field(pattern=r"^(red|blue)$")


class WidgetOut(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_serialization_defaults_required=True)
    id: str
    name: str
    region: str
    colour: str
    status: str
    status_reason: str | None


async def test_a_registered_type_gets_the_generic_routes_and_document(settings: Any, pool: asyncpg.Pool,
                                                                     widgets: ResourceType[Widget]) -> None:
    from z9.api import app as api_app
    from z9.api.resources import ApiResource, CreateContext
    from z9.common.ids import new_id

    async def create(ctx: CreateContext, spec: WidgetCreate) -> tuple[Widget, dict[str, Any]]:
        async with ctx.conn.transaction():
            row = Widget.from_record(await ctx.conn.fetchrow(
                "INSERT INTO widgets (id, tenant_id, region, name, colour) VALUES ($1, $2, $3, $4, $5) RETURNING *",
                new_id("wdg"), ctx.tenant_id, spec.region, spec.name, spec.colour))
            job = await store.job_insert(ctx.conn, widgets.new_job(row, "WidgetCreate"), notify=False)
        return row, job.brief()

    example = {"id": "wdg_01jd3x5v8q2m6n4p7r9s1t3w5y", "name": "w1", "region": REGION, "colour": "red",
               "status": "creating", "status_reason": None}
    reg = ApiResource(rtype=widgets, create_model=WidgetCreate, public_model=WidgetOut, create=create,
                      example=example, transactional=True)
    api_app.RESOURCES.append(reg)
    try:
        async with api_stack(settings, pool) as api:
            status, out = await api.call("POST", "/widgets", json={"name": "w1", "region": REGION, "colour": "red"})
            assert status == 202 and out["widget"]["status"] == "creating" and out["job"]["kind"] == "WidgetCreate"
            wid = out["widget"]["id"]
            assert (await api.call("POST", "/widgets", json={"name": "w1", "region": "nowhere", "colour": "red"}))[0] == 422
            assert (await api.call("GET", f"/widgets/{wid}"))[1]["widget"]["id"] == wid
            assert [w["id"] for w in (await api.call("GET", "/widgets"))[1]["widgets"]] == [wid]
            status, out = await api.call("DELETE", f"/widgets/{wid}")
            assert status == 202 and out["widget"]["status"] == "destroying" and out["job"]["kind"] == "WidgetDelete"
            # the job locks the widget: WidgetCreate first, then WidgetDelete
            jobs = (await api.call("GET", f"/jobs?resource_id={wid}"))[1]["jobs"]
            assert [j["kind"] for j in jobs] == ["WidgetCreate", "WidgetDelete"]
            async with api.http.get(api.base + "/openapi.json") as r:
                doc = await r.json()
            assert {"/widgets", "/widgets/{id}"} <= set(doc["paths"])
            assert "/widgets/{id}/actions/cancel-deletion" not in doc["paths"]  # immediate deletion
            assert doc["paths"]["/widgets"]["post"]["tags"] == ["widgets"]
            assert "WidgetOut" in doc["components"]["schemas"]
    finally:
        api_app.RESOURCES.remove(reg)
