"""What operators see (``/v1/operator/…``, a token with the ``operator`` scope only; any other
token: 403 ``insufficient_scope``): every tenant's jobs, the regions' caps and load, the
deletion guard's refusals, a job's history, and cancelling any tenant's waiting job.

- ``GET /v1/operator/jobs?region=&kind=&status=&tenant=&include_observe=&limit=&after=``: the live
  jobs first — ``retry``, then ``pending``, then ``running``, each oldest first (what is stuck is
  on top) — then the finished ones, newest first; each with its tenant (id and name), attempts,
  error, lease owner and the UPID its running step waits on (in its steps); a page at a time
  (``next_after``: an opaque page token, :mod:`z9.api.page_tokens`, holding the last job's place in
  that order — a job that changed status since may show twice or not at all, as in any live list).
- ``GET /v1/operator/jobs/{id}``: one job of any tenant with who asked (``actor``), the request
  id, the W3C trace id (``trace_url`` when ``Z9_TRACING_UI_URL`` is set) and its resource's
  newest other jobs (``history``: at most ``HISTORY_MAX``, the periodic observe-only ones left
  out, oldest first; the job itself always in it).
- ``POST /v1/operator/jobs/{id}/actions/cancel``: as the tenant's own cancel
  (:mod:`z9.api.job_actions`), for a job of any tenant.
- ``GET /v1/operator/regions``: each configured region with its cap (``max_concurrent_jobs``)
  and its live jobs by status (running across every executor, from the job table), and who is
  waiting: its tenants with live jobs, most pending first (at most ``TENANTS_SHOWN``; the number
  left out in ``tenants_more``), each with its running jobs against its cap
  (``Z9_TENANT_MAX_RUNNING_JOBS`` or its own ``running_jobs``) and how long its oldest pending
  job has waited.
- ``GET /v1/operator/guard-refusals?region=&limit=``: the jobs the deletion guard refused,
  newest first.
- ``GET /v1/operator/drift?kind=&limit=``: the live resources whose last periodic plan (the reaper's,
  :mod:`z9.reaper.drift`) found drift, drifted longest first, each with its drift and the steps its
  job would run.
"""
from __future__ import annotations

from datetime import UTC, datetime, timezone
from typing import Any

from aiohttp import web
from pydantic import BaseModel, Field

from z9.common import kinds, store
from z9.common.errors import Forbidden, NotFound, ValidationFailed
from z9.common.ids import is_id
from z9.common.models import Job

from . import job_actions, page_tokens, schemas
from .resources import POOL, SETTINGS, Operation, bool_param, dump, limit_param, path_id

JOB_STATUSES = ("pending", "running", "retry", "succeeded", "failed")


def require_operator(request: web.Request) -> None:
    from .tokens import PRINCIPAL

    p = request[PRINCIPAL]
    if not p.operator:
        raise Forbidden(f"this token has scopes {','.join(sorted(p.scopes))}: the operator views need the operator "
                        "scope (z9 token --scope operator)", code="insufficient_scope", details=[{"scope": "operator"}])


# ---------------------------------------------------------------------------------- models

class OperatorJob(schemas.Job):
    """A job as operators see it: the tenant's fields and the platform's."""

    tenant: str | None = Field(description="the tenant the job belongs to (null: z9's own)")
    tenant_name: str | None = Field(description="that tenant's name (null: z9's own)")
    lease_owner: str | None = Field(description="the executor process running it (while running)")
    lease_expires_at: schemas.OptTimestamp = Field(description="when its lease runs out (while running)")
    trace_id: str | None = Field(description="the W3C trace id of the request that made it")


class OperatorJobList(schemas.Response):
    jobs: list[OperatorJob]


class OperatorJobPage(schemas.Response):
    jobs: list[OperatorJob]
    next_after: str | None = Field(description="the next page's `after` (null: this is the last page)")


class OperatorJobDetail(schemas.Response):
    job: OperatorJob
    trace_url: str | None = Field(description="the job's trace in the tracing UI (Z9_TRACING_UI_URL; null: none)")
    history: list[OperatorJob] = Field(description="the newest jobs of the same resource (at most 500, the periodic "
                                                   "observe-only ones left out), oldest first; the job itself always")


TENANTS_SHOWN = 20  # tenants listed per region in GET /v1/operator/regions


class TenantLoad(schemas.Response):
    tenant: str | None = Field(description="the tenant's id (null: z9's own jobs)")
    tenant_name: str | None = Field(description="the tenant's name (null: z9's own jobs)")
    pending: int
    running: int
    retry: int
    running_cap: int | None = Field(description="most of its jobs running at once in the region (its own "
                                                "running_jobs limit, else Z9_TENANT_MAX_RUNNING_JOBS; null: none)")
    waiting_since: schemas.OptTimestamp = Field(description="since when its oldest pending job could run "
                                                            "(max(created_at, run_after); null: none pending)")
    wait_s: float = Field(description="how long that job has waited, in seconds (0: none pending)")


class RegionLoad(schemas.Response):
    name: str
    max_concurrent_jobs: int | None = Field(description="the cap on its running jobs across executors (null: none)")
    running: int
    pending: int
    retry: int
    oldest_pending_at: schemas.OptTimestamp = Field(description="when its oldest pending job was created")
    tenants: list[TenantLoad] = Field(description="who is waiting: its tenants with live jobs, most pending jobs "
                                                  f"first (at most {TENANTS_SHOWN})")
    tenants_more: int = Field(description="tenants with live jobs left out of `tenants`")


class RegionLoadList(schemas.Response):
    regions: list[RegionLoad]


class OperatorJobQuery(BaseModel):
    """Query parameters of ``GET /v1/operator/jobs``."""

    region: str | None = Field(default=None, min_length=1, max_length=63)
    kind: str | None = Field(default=None, min_length=1, max_length=63)
    status: str | None = Field(default=None, json_schema_extra={"enum": list(JOB_STATUSES)})
    tenant: str | None = Field(default=None, min_length=1, max_length=63,
                               description="only this tenant's jobs: its id (ten_…) or its name")
    include_observe: bool = Field(default=False, description="the periodic observe-only jobs too")
    limit: int = Field(default=100, ge=1, le=500)
    after: str | None = Field(default=None, description="the previous page's `next_after` (a page token)",
                              json_schema_extra={"pattern": page_tokens.PATTERN})


class GuardRefusalQuery(BaseModel):
    """Query parameters of ``GET /v1/operator/guard-refusals``."""

    region: str | None = Field(default=None, min_length=1, max_length=63)
    limit: int = Field(default=100, ge=1, le=500)


class DriftQuery(BaseModel):
    """Query parameters of ``GET /v1/operator/drift``."""

    kind: str | None = Field(default=None, min_length=1, max_length=63, description="only resources of this type")
    limit: int = Field(default=100, ge=1, le=500)


class DriftedResource(schemas.Response):
    """A resource whose last periodic plan found drift."""

    kind: str
    id: str
    tenant: str
    region: str
    job_kind: str | None = Field(description="the job whose plan it is")
    drift: list[dict[str, Any]] = Field(description="{path, want, have} each")
    steps: list[dict[str, Any]] = Field(description="{name, member, disruptive, why} each")
    checked_at: schemas.Timestamp
    drifted_since: schemas.Timestamp


class DriftedList(schemas.Response):
    """The drifted resources, drifted longest first."""

    resources: list[DriftedResource]


# ---------------------------------------------------------------------------------- handlers

def _trace_id(job: Job) -> str | None:
    parent = (job.trace_context or {}).get("traceparent")
    if isinstance(parent, str):
        parts = parent.split("-")
        if len(parts) >= 3 and len(parts[1]) == 32:
            return parts[1]
    return None


def _public(job: Job, names: dict[str, str]) -> dict[str, Any]:
    return {**job.public(), "tenant": job.tenant_id, "tenant_name": names.get(job.tenant_id or ""),
            "lease_owner": job.lease_owner,
            "lease_expires_at": job.lease_expires_at.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")
            if isinstance(job.lease_expires_at, datetime) else None, "trace_id": _trace_id(job)}


def _text_param(request: web.Request, name: str) -> str | None:
    raw = request.query.get(name)
    if raw is not None and not 1 <= len(raw) <= 63:
        raise ValidationFailed(f"{name}: 1 to 63 characters", details=[{"field": name, "message": "1..63 characters"}])
    return raw


# Operator page tokens are made for this name in place of a tenant's id (a tenant's token is refused
# here, and an operator's by a tenant's list); the position (rank 0-3, key ±seq) in one number.
_PAGES_FOR = "operator jobs"
_KEY_BIAS = 1 << 60


def _page_token(request: web.Request, job: Job) -> str:
    rank, key = store.job_operator_position(job)
    return request.app[page_tokens.PAGE_KEYS].encode(_PAGES_FOR, (rank << 61) + key + _KEY_BIAS)


def _page_position(request: web.Request) -> tuple[int, int] | None:
    after = request.query.get("after")
    if after is None:
        return None
    n = request.app[page_tokens.PAGE_KEYS].decode(_PAGES_FOR, after)
    if n is None:
        raise ValidationFailed(f"after: {after!r} is not a page token of this list (the previous page's next_after)",
                               details=[{"field": "after", "message": "not a page token of this list"}])
    return n >> 61, (n & ((1 << 61) - 1)) - _KEY_BIAS


async def _with_names(request: web.Request, jobs: list[Job]) -> list[dict[str, Any]]:
    names = await store.tenant_names(request.app[POOL], (j.tenant_id for j in jobs))
    return [_public(j, names) for j in jobs]


async def list_jobs(request: web.Request) -> web.Response:
    require_operator(request)
    status = request.query.get("status")
    if status is not None and status not in JOB_STATUSES:
        raise ValidationFailed(f"status: must be one of {', '.join(JOB_STATUSES)}",
                               details=[{"field": "status", "message": "unknown status"}])
    tenant_id = request.query.get("tenant")
    if tenant_id is not None and not is_id(tenant_id, "ten"):  # a tenant's name (what operators see): its id
        named = await store.tenant_id_by_name(request.app[POOL], tenant_id)
        if named is None:
            raise ValidationFailed(f"tenant: {tenant_id!r} is neither a tenant id (ten_…) nor a tenant's name",
                                   details=[{"field": "tenant", "message": "no such tenant"}])
        tenant_id = named
    include_observe = bool_param(request, "include_observe", default=False)
    limit = limit_param(request)
    jobs = await store.job_list_operator(request.app[POOL], region=_text_param(request, "region"),
                                         kind=_text_param(request, "kind"), status=status, tenant_id=tenant_id,
                                         limit=limit, exclude_kinds=() if include_observe else kinds.observe_only(),
                                         after=_page_position(request))
    return web.json_response(dump(OperatorJobPage, {
        "jobs": await _with_names(request, jobs),
        "next_after": _page_token(request, jobs[-1]) if len(jobs) == limit else None}))


async def _any_job(request: web.Request) -> Job:
    jid = path_id(request, "job", "job")
    job = await store.job_get(request.app[POOL], jid)
    if job is None:
        raise NotFound(f"no job {jid!r}")
    return job


HISTORY_MAX = 500


async def get_job(request: web.Request) -> web.Response:
    require_operator(request)
    job = await _any_job(request)
    history: list[Job] = [job]
    if job.resource_id is not None and job.tenant_id is not None:
        # the resource's newest jobs (a long-lived resource has thousands of periodic observes:
        # left out, as the tenant's own job list does), oldest first, the job itself always in
        newest = await store.job_list(request.app[POOL], job.tenant_id, resource_id=job.resource_id,
                                      limit=HISTORY_MAX, newest_first=True, exclude_kinds=kinds.observe_only())
        if all(j.id != job.id for j in newest):
            newest.append(job)
        history = sorted(newest, key=lambda j: j.seq)
    template = request.app[SETTINGS].tracing_ui_url
    trace_id = _trace_id(job)
    url = template.replace("{trace_id}", trace_id) if template and trace_id else None
    names = await store.tenant_names(request.app[POOL], [job.tenant_id])
    return web.json_response(dump(OperatorJobDetail, {"job": _public(job, names), "trace_url": url,
                                                      "history": [_public(j, names) for j in history]}))


async def cancel_job(request: web.Request) -> web.Response:
    require_operator(request)
    job = await _any_job(request)
    if job.tenant_id is None:
        raise NotFound(f"no job {job.id!r} of a tenant")
    return await job_actions.cancel_for(request, job.tenant_id)


async def list_regions(request: web.Request) -> web.Response:
    require_operator(request)
    counts: dict[str, dict[str, Any]] = {}
    for row in await store.job_live_counts_by_region(request.app[POOL]):
        r = counts.setdefault(row["region"], {"running": 0, "pending": 0, "retry": 0, "oldest_pending_at": None})
        r[row["status"]] = row["n"]
        if row["status"] == "pending":
            r["oldest_pending_at"] = row["oldest"].astimezone(timezone.utc).isoformat().replace("+00:00", "Z")
    settings = request.app[SETTINGS]
    tenants: dict[str, list[dict[str, Any]]] = {}
    rows = await store.job_live_by_tenant(request.app[POOL])  # most pending first
    tenant_names = await store.tenant_names(request.app[POOL], (row["tenant_id"] for row in rows))
    for row in rows:
        cap = row["running_cap"] if row["running_cap"] is not None else settings.tenant_max_running_jobs
        tenants.setdefault(row["region"], []).append({
            "tenant": row["tenant_id"], "tenant_name": tenant_names.get(row["tenant_id"]), "pending": row["pending"], "running": row["running"], "retry": row["retry"],
            "running_cap": None if row["tenant_id"] is None else cap, "wait_s": round(row["wait_s"], 3),
            "waiting_since": None if row["oldest_runnable"] is None else
            row["oldest_runnable"].astimezone(timezone.utc).isoformat().replace("+00:00", "Z")})
    names = sorted(set(settings.regions) | set(counts))
    regions = [{"name": n, "max_concurrent_jobs": settings.regions[n].max_concurrent_jobs if n in settings.regions
                else None, **counts.get(n, {"running": 0, "pending": 0, "retry": 0, "oldest_pending_at": None}),
                "tenants": tenants.get(n, [])[:TENANTS_SHOWN], "tenants_more": max(0, len(tenants.get(n, [])) - TENANTS_SHOWN)}
               for n in names]
    return web.json_response(dump(RegionLoadList, {"regions": regions}))


async def list_guard_refusals(request: web.Request) -> web.Response:
    require_operator(request)
    jobs = await store.job_list_guard_refusals(request.app[POOL], region=_text_param(request, "region"),
                                               limit=limit_param(request))
    return web.json_response(dump(OperatorJobList, {"jobs": await _with_names(request, jobs)}))


def _iso(at: datetime) -> str:
    return at.astimezone(UTC).isoformat().replace("+00:00", "Z")


async def list_drift(request: web.Request) -> web.Response:
    from z9 import resources

    require_operator(request)
    kind = _text_param(request, "kind")
    types = [t for t in resources.types() if t.plan_of is not None and kind in (None, t.name)]
    if kind is not None and not types:
        raise ValidationFailed(f"kind: {kind!r} is no resource type that is planned",
                               details=[{"field": "kind", "message": "unknown"}])
    limit = limit_param(request)
    rows = [r for t in types for r in await store.resource_drift_drifted(request.app[POOL], t.sql, t.name, limit)]
    rows.sort(key=lambda r: (r["drifted_since"], r["resource_id"]))
    out = [{"kind": r["resource_type"], "id": r["resource_id"], "tenant": r["tenant_id"], "region": r["region"],
            "job_kind": r["job_kind"], "drift": r["drift"], "steps": r["steps"],
            "checked_at": _iso(r["checked_at"]), "drifted_since": _iso(r["drifted_since"])} for r in rows[:limit]]
    return web.json_response(dump(DriftedList, {"resources": out}))


def operations(job_example: dict[str, Any]) -> list[Operation]:
    op_job = {**job_example, "tenant": "ten_01jd3x5v8q2m6n4p7r9s1t3w5y", "tenant_name": "acme", "lease_owner": "pve-exec-1:4242:ab12",
              "lease_expires_at": "2026-12-01T04:00:39Z", "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736"}
    errors: dict[int, Any] = {401: None, 403: None}
    desc = "Needs a token with the operator scope (`z9 token --scope operator`); any other answers 403."
    return [
        Operation("GET", "/operator/jobs", list_jobs, "operatorListJobs",
                  "Every tenant's jobs: retrying, pending, running (oldest first), then finished (newest first)",
                  "operator", {200: OperatorJobPage, **errors, 422: None}, query=OperatorJobQuery,
                  example={"jobs": [op_job], "next_after": None}, description=desc),
        Operation("GET", "/operator/jobs/{id}", get_job, "operatorGetJob",
                  "Any tenant's job with its trace and its resource's job history", "operator",
                  {200: OperatorJobDetail, **errors, 404: None}, path_id="the job's id (job_…)",
                  example={"job": op_job, "trace_url": None, "history": [op_job]}, description=desc),
        Operation("POST", "/operator/jobs/{id}/actions/cancel", cancel_job, "operatorCancelJob",
                  "Cancel any tenant's pending or retrying job", "operator",
                  {200: job_actions.JobOne, **errors, 404: None, 409: None, 429: None}, path_id="the job's id (job_…)",
                  example={"job": {**job_example, "status": "failed"}}, description=desc),
        Operation("GET", "/operator/regions", list_regions, "operatorListRegions",
                  "Every region with its cap, its live jobs by status and who is waiting", "operator",
                  {200: RegionLoadList, **errors}, example={"regions": [
                      {"name": "dev-1", "max_concurrent_jobs": 12, "running": 3, "pending": 1, "retry": 2,
                       "oldest_pending_at": "2026-12-01T04:00:00Z", "tenants_more": 0, "tenants": [
                           {"tenant": "ten_01jd3x5v8q2m6n4p7r9s1t3w5y", "tenant_name": "acme", "pending": 1, "running": 3, "retry": 2,
                            "running_cap": 4, "waiting_since": "2026-12-01T04:00:00Z", "wait_s": 12.5}]}]},
                  description=desc),
        Operation("GET", "/operator/guard-refusals", list_guard_refusals, "operatorListGuardRefusals",
                  "Jobs the deletion guard refused, newest first", "operator",
                  {200: OperatorJobList, **errors, 422: None}, query=GuardRefusalQuery,
                  example={"jobs": [op_job]}, description=desc),
        Operation("GET", "/operator/drift", list_drift, "operatorListDrift",
                  "Resources whose last periodic plan found drift, drifted longest first", "operator",
                  {200: DriftedList, **errors, 422: None}, query=DriftQuery,
                  example={"resources": [{
                      "kind": "server", "id": "srv_01jd3x5v8q2m6n4p7r9s1t3w5y", "tenant": "ten_01jd3x5v8q2m6n4p7r9s1t3w5y",
                      "region": "dev-1", "job_kind": "ServerCreate",
                      "drift": [{"path": "config.cores", "want": 2, "have": 4}],
                      "steps": [{"name": "configure", "member": None, "disruptive": False, "why": "write cores"}],
                      "checked_at": "2026-12-01T04:10:00Z", "drifted_since": "2026-12-01T03:40:00Z"}]},
                  description=desc),
    ]
