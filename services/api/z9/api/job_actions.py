"""A job's own routes: cancel one that has not run yet, re-run a failed one's intent.

Cancel (``POST /v1/jobs/{id}/actions/cancel``): a ``pending`` or ``retry`` job ends ``failed``
with error class ``cancelled`` (the five statuses stay five). A ``running`` job answers 409
``job_running``: its current step acts on the hypervisor (a UPID may be in flight) and stopping
it half-way would leave the world between two states the job's own phases know how to finish;
the executor's cancellation between steps (a job superseded by a delete) is the executor's to
decide, not a customer's. A finished job answers 409 ``job_finished`` (a cancelled one answers
200 again: cancelling is idempotent, so a client may retry it). The job's resource is
left as it is, except where nothing else would ever move it on: a resource still ``creating``
with no job of its own left (its create was cancelled, and nothing queued behind it) or a
cancelled final delete ends ``failed`` (the generic rule of a failed job,
``ResourceType.job_cancelled``, where a type may add its own: a cluster ``updating`` ends
``degraded``), so it can be deleted or re-created. The final job of an *immediate* deletion (a
Kubernetes cluster's ClusterDelete: "no buffer and no cancel") answers 409 ``job_not_cancellable``.

Re-run (``POST /v1/jobs/{id}/actions/rerun``): a ``failed`` job's kind, arguments, resource
and lock keys as a new job (202 with the new job; ``Location`` follows it). Refused (409) for a
job of the deletion itself (delete the resource again instead: its final job, or its first kind
while the resource is being deleted — outside a deletion that kind is an ordinary action, a
server's stop, an address's unassign, and is re-run), for a resource being deleted,
and (``job_superseded``) for a job a later request replaced as the resource's intent
(``ResourceType.stale``: an address assigned elsewhere since).
"""
from __future__ import annotations

from typing import Any

from aiohttp import web
from pydantic import Field

from z9.common import store
from z9 import resources
from z9.common.errors import Conflict, NotFound
from z9.common.errors import deleting as resource_deleting
from z9.common.models import Job
from z9.resources import Buffered, Immediate

from . import schemas
from .resources import (NOTIFIER, POOL, SETTINGS, Operation, dump, idempotency_begin, idempotency_end,
                        idempotency_key, path_id, request_hash, room_for_a_job, tenant)
from z9.common.requestctx import current_actor


class JobAccepted(schemas.Response):
    """A new job (``POST /v1/jobs/{id}/actions/rerun``); ``jobs``: every job the re-run made,
    ``job`` first (a server's failed create re-runs its primary address's failed AddressAssign)."""

    job: schemas.Job
    jobs: list[schemas.Job] = Field(default_factory=list)


class JobOne(schemas.Response):
    job: schemas.Job


async def _locked(conn: Any, request: web.Request, tenant_id: str | None = None) -> Job:
    jid = path_id(request, "job", "job")
    job = await store.job_get_for_update(conn, jid, tenant_id if tenant_id is not None else tenant(request))
    if job is None:
        raise NotFound(f"no job {jid!r}")
    return job


async def cancel(request: web.Request) -> web.Response:
    return await cancel_for(request, tenant(request))


async def cancel_for(request: web.Request, tenant_id: str) -> web.Response:
    """Cancel the path's job of ``tenant_id`` (the caller's own; an operator's: the job's tenant)."""
    pool = request.app[POOL]
    async with pool.acquire() as conn, conn.transaction():
        job = await _locked(conn, request, tenant_id)
        if job.status == "running":
            raise Conflict(f"job {job.id} is running (attempt {job.attempt}); a running job cannot be cancelled: its "
                           "current step acts on the hypervisor. Wait for it to finish, then undo its effect "
                           "with another request", code="job_running")
        if job.status == "failed" and (job.error or {}).get("class") == "cancelled":
            return web.json_response(dump(JobOne, {"job": job.public()}))  # cancelled already: the same answer
        if job.status in ("succeeded", "failed"):
            raise Conflict(f"job {job.id} is {job.status}; only a pending or retrying job can be cancelled",
                           code="job_finished")
        rtype = resources.get(job.resource_type)
        if rtype is not None and isinstance(rtype.deletion, Immediate) and job.kind == rtype.final_kind:
            raise Conflict(f"job {job.id} is the deletion of {rtype.name} {job.resource_id} ({job.kind}); an "
                           f"immediate deletion has no cancel: once confirmed, the {rtype.name} goes",
                           code="job_not_cancellable")
        message = f"cancelled by {current_actor() or 'the tenant'} while {job.status}"
        done = await store.job_cancel(conn, job.id, tenant_id, {"class": "cancelled", "message": message})
        assert done is not None  # the row is locked and was pending or retry
        if rtype is not None and job.resource_id is not None:
            row = await rtype.get(conn, job.resource_id)
            if row is not None:
                await rtype.job_cancelled(conn, row, job.kind, f"{job.kind} job {job.id} was {message}")
    return web.json_response(dump(JobOne, {"job": done.public()}))


async def rerun(request: web.Request) -> web.Response:
    settings, pool, tenant_id = request.app[SETTINGS], request.app[POOL], tenant(request)
    key = idempotency_key(request)
    req_hash = request_hash("POST /jobs/{id}/actions/rerun", request.match_info["id"])
    async with pool.acquire() as conn, conn.transaction():
        replay = await idempotency_begin(conn, tenant_id, key, req_hash)
        if replay is not None:
            return replay
        job = await _locked(conn, request)
        new, also = await _rerun_one(conn, settings, job)
        made = [new]
        for jid in also:  # e.g. a server's create: the AddressAssign that failed for want of its VM
            dep = await store.job_get_for_update(conn, jid, tenant_id)
            if dep is None or dep.status != "failed":
                continue
            try:
                async with conn.transaction():  # a savepoint: a refused one leaves the rest
                    made.append((await _rerun_one(conn, settings, dep))[0])
            except Conflict:
                continue  # superseded, or no room: the customer's own re-run of it says why
        answer = dump(JobAccepted, {"job": new.public(), "jobs": [j.public() for j in made]})
        await idempotency_end(conn, tenant_id, key, req_hash, 202, answer)
    for region in dict.fromkeys(j.region for j in made):
        request.app[NOTIFIER].notify(region)
    return web.json_response(answer, status=202, headers={"Location": f"/v1/jobs/{new.id}"})


async def _rerun_one(conn: Any, settings: Any, job: Job) -> tuple[Job, list[str]]:
    """The new job re-running failed ``job`` (row locked), and the ids of the failed jobs of other
    resources its type re-runs with it (``ResourceType.rerun_with``). Raises the 409s above."""
    if job.status != "failed":
        raise Conflict(f"job {job.id} is {job.status}; only a failed job can be re-run", code="job_not_failed")
    rtype = resources.get(job.resource_type)
    if rtype is None or job.resource_id is None:
        raise Conflict(f"job {job.id} has no resource to act on", code="job_not_rerunnable")
    row = await rtype.get(conn, job.resource_id)
    deleting = row is None or row.status in ("deleting", "destroying", "deleted")
    # a buffered deletion's first kind is also an ordinary action of the type (a server's
    # stop, an address's unassign): only while the resource is being deleted is such a job
    # the deletion's own
    first = rtype.deletion.first_kind if isinstance(rtype.deletion, Buffered) else None
    if job.kind == rtype.final_kind or (job.kind == first and deleting):
        raise Conflict(f"job {job.id} is part of a deletion ({job.kind}); delete the {rtype.name} again instead",
                       code="job_not_rerunnable")
    if row is None or row.status in ("deleting", "destroying", "deleted"):
        raise Conflict(f"{rtype.name} {job.resource_id} is {row.status if row else 'gone'}; its jobs cannot be "
                       "re-run", **resource_deleting(rtype.name, job.resource_id, row.status if row else "deleted"))
    why = rtype.stale(row, job.kind, job.args or {}) if rtype.stale is not None else None
    if why is not None:
        raise Conflict(f"job {job.id} cannot be re-run: {why}", code="job_superseded")
    await room_for_a_job(conn, settings, rtype.name, row.id)
    # the resource's current intent (what it says now), not the old request's arguments
    args = rtype.intent(row, job.kind, dict(job.args or {})) if rtype.intent is not None else job.args
    new = await store.job_insert(conn, rtype.new_job(row, job.kind, args=args, max_attempts=job.max_attempts,
                                                     extra_lock_keys=tuple(job.extra_lock_keys)), notify=False)
    also = await rtype.rerun_with(conn, row, job.kind) if rtype.rerun_with is not None else []
    return new, also


def operations(job_example: dict[str, Any]) -> list[Operation]:
    id_doc = "the job's id (job_…)"
    errors: dict[int, Any] = {401: None, 403: None, 404: None, 409: None, 429: None}
    cancelled = {**job_example, "status": "failed", "finished_at": "2026-12-01T04:00:02Z",
                 "error": {"class": "cancelled", "message": "cancelled by tok_01jd3x5v8q2m6n4p7r9s1t3w5y while pending",
                           "at": None, "task_log": None}}
    return [
        Operation("POST", "/jobs/{id}/actions/cancel", cancel, "cancelJob",
                  "Cancel a pending or retrying job (it ends failed, error class cancelled)", "jobs",
                  {200: JobOne, **errors}, path_id=id_doc, example={"job": cancelled}),
        Operation("POST", "/jobs/{id}/actions/rerun", rerun, "rerunJob",
                  "Re-run a failed job's intent as a new job", "jobs",
                  {202: JobAccepted, **errors}, path_id=id_doc, idempotent=True,
                  example={"job": {**job_example, "status": "pending", "steps": [], "started_at": None}}),
    ]
