"""aiohttp application factory of the ``/v1`` API: the middlewares, the jobs routes, and the
generic routes of every resource type registered in :data:`RESOURCES` (``z9.api.resources``).

Errors are JSON ``{"error": {"code", "message", "details"}}``: 400 malformed JSON, 401 missing or
unknown token, 404 unknown (or another tenant's) resource, 409 a failed precondition (the
message names it), 422 invalid fields (the message names each field). Nothing else ever leaks
as a 500 without being logged once.
"""
from __future__ import annotations

import logging
import re
import time
from typing import Any, AsyncIterator

import asyncpg
from aiohttp import web

from z9.common import kinds, metrics, store
from z9.common.db import LOCK_WAIT_ERRORS, TRANSIENT_DB_ERRORS, create_service_pool
from z9.common.errors import LockWaitTimeout
from z9.common.errors import ApiError, ValidationFailed
from z9.common.ids import id_pattern, is_id, prefixes
from z9.common.models import Job
from z9.common.notify import JobNotifier
from z9.common.clock import SYSTEM, Clock
from z9.common.settings import Settings

from .connections import RateLimitedLog
from . import page_tokens
from . import catalog, console, job_actions, middleware, operator, plans, quotas, schemas, tokens, waiting
from z9 import resources
from .openapi import openapi_document
from .resources import (CLOCK, NOTIFIER, POOL, SETTINGS, TENANT, ApiResource, Handler, Operation, bool_param, dump,
                        limit_param, resource_operations, tenant)
from z9.resources.address import store as address_store

log = logging.getLogger("z9.api")

RESOURCES: list[ApiResource] = [m.API for _, m in resources.slice_modules("api")]
"""The resource types the API serves (each gets create, list, get, delete, cancel-deletion and
its own actions): each registered type's ``api`` module (``resources/z9/resources/<type>/api.py``),
in the registry's order."""

OPENAPI = web.AppKey("openapi", dict)


def _error_body(status: int, code: str, message: str, details: Any = None) -> web.Response:
    return web.json_response({"error": {"code": code, "message": message,
                                        "details": [] if details is None else details}}, status=status)


@web.middleware
async def metrics_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Count and time every request by method, route template (``unmatched`` when no route
    matched) and status (``z9_http_requests_total``, ``z9_http_request_duration_seconds``)."""
    start = time.perf_counter()
    status = 500
    try:
        response = await handler(request)
        status = response.status
        return response
    except web.HTTPException as e:
        status = e.status
        raise
    finally:
        resource = request.match_info.route.resource
        route = resource.canonical if resource is not None else "unmatched"
        method = metrics.http_method_label(request.method)
        metrics.HTTP_REQUEST_DURATION.labels(method, route).observe(time.perf_counter() - start)
        metrics.HTTP_REQUESTS.labels(method, route, str(status)).inc()


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Typed errors → JSON 4xx; database unreachable → 503 with Retry-After; aiohttp's HTTP
    errors → JSON; anything else → logged 500."""
    try:
        return await handler(request)
    except ApiError as e:
        resp = _error_body(e.status, e.code, e.message, e.details)
        resp.headers.update(e.headers)
        return resp
    except TRANSIENT_DB_ERRORS as e:  # (a ConnectionResetError too: aiohttp's, of a client gone mid-body)
        if _client_gone(request):  # what the handler met is the client's own disconnect
            return _client_disconnected(request, e)
        _ERROR_LOG.log(logging.WARNING, "database unavailable", "database unavailable on %s %s: %s",
                       request.method, request.path, e)  # an outage under load: a bounded rate, not a line each
        resp = _error_body(503, "unavailable", "the database is unreachable right now; retry shortly")
        resp.headers["Retry-After"] = "2"
        return resp
    except (LockWaitTimeout, *LOCK_WAIT_ERRORS) as e:
        _ERROR_LOG.log(logging.WARNING, "lock wait", "gave up waiting for a lock on %s %s: %s",
                       request.method, request.path, e)
        resp = _error_body(503, "busy", "another change to the same objects is still in progress; retry shortly")
        resp.headers["Retry-After"] = "1"
        return resp
    except web.HTTPException as e:
        if e.status < 400:
            raise
        return _error_body(e.status, e.reason.lower().replace(" ", "_"), f"{e.reason}: {request.method} {request.path}")
    except Exception as e:
        if _client_gone(request):
            return _client_disconnected(request, e)
        _ERROR_LOG.log(logging.ERROR, "unhandled", "unhandled error on %s %s", request.method, request.path,
                       exc_info=True)
        return _error_body(500, "internal", "internal error; it has been logged")


CLIENT_CLOSED_REQUEST = 499  # nginx's status for a request whose client went away first


def _client_gone(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()


def _client_disconnected(request: web.Request, e: BaseException) -> web.Response:
    """The client went away (mid-body, or before the answer): one INFO line saying so, counted as
    status 499 (never a 5xx, never ``database unavailable``); nobody is left to read the answer."""
    metrics.API_CLIENT_DISCONNECTS.inc()
    _DISCONNECT_LOG.log(logging.INFO, "disconnect", "client %s disconnected before the answer to %s %s (%s)",
                        request.remote, request.method, request.path, type(e).__name__)
    return web.Response(status=CLIENT_CLOSED_REQUEST)


_DISCONNECT_LOG = RateLimitedLog(log)
_ERROR_LOG = RateLimitedLog(log, burst=20)  # the service's own errors: at most 20 lines per 10 s per kind


# ---------------------------------------------------------------------------------- jobs

async def list_jobs(request: web.Request) -> web.Response:
    rid = request.query.get("resource_id")
    if rid is not None and not is_id(rid):
        raise ValidationFailed(f"resource_id: {rid!r} is not a resource id",
                               details=[{"field": "resource_id", "message": "not a resource id"}])
    after = request.query.get("after")
    after_seq = None
    pool, tenant_id = request.app[POOL], tenant(request)
    if after is not None:
        after_seq = request.app[page_tokens.PAGE_KEYS].decode(tenant_id, after)
        if after_seq is None:
            ref = await store.job_get(pool, after, tenant_id) if is_id(after, "job") else None
            if ref is None:
                raise ValidationFailed(f"after: no job {after!r} (and not a page token)",
                                       details=[{"field": "after", "message": "unknown job"}])
            after_seq = ref.seq
    limit = limit_param(request)
    actor = tokens.actor_filter(request)
    order = request.query.get("order", "oldest")
    if order not in ("oldest", "newest"):
        raise ValidationFailed("order: must be oldest or newest", details=[{"field": "order", "message": "oldest or newest"}])
    status = request.query.get("status")
    if status is not None and status not in JOB_STATUSES:
        raise ValidationFailed(f"status: must be one of {', '.join(JOB_STATUSES)}",
                               details=[{"field": "status", "message": "unknown status"}])
    kind = request.query.get("kind")
    if kind is not None and not 1 <= len(kind) <= 63:
        raise ValidationFailed("kind: 1 to 63 characters", details=[{"field": "kind", "message": "1..63 characters"}])
    if kind is not None and kind not in kinds.all_kinds():  # a typo would otherwise list nothing, silently
        known = sorted(kinds.all_kinds())
        raise ValidationFailed(f"kind: no job kind {kind!r} (the kinds: {', '.join(known)})",
                               details=[{"field": "kind", "message": f"unknown job kind {kind!r}"}])
    include_observe = bool_param(request, "include_observe", default=True)
    jobs: list[Job] = await store.job_list(pool, tenant_id, resource_id=rid, after_seq=after_seq, limit=limit,
                                           actor_token_id=actor, newest_first=order == "newest", status=status,
                                           kind=kind, exclude_kinds=() if include_observe else kinds.observe_only())
    return web.json_response(dump(schemas.JobList, {"jobs": [j.public() for j in jobs],
                                                    "next_after": request.app[page_tokens.PAGE_KEYS].encode(
                                                        tenant_id, jobs[-1].seq) if len(jobs) == limit else None}))


# Job pages: `next_after` is an opaque page token carrying the last job's position (its seq, sealed:
# z9.api.page_tokens), not its id, so it stays valid after that job was pruned
# (Z9_JOB_RETENTION_S); `after` still takes a job id.


JOB_STATUSES = ("pending", "running", "retry", "succeeded", "failed")


class JobListQuery(schemas.BaseModel):
    """Query parameters of ``GET /v1/jobs``."""

    after: str | None = schemas.Field(default=None, description="the previous page's `next_after` (a page token, "
                                                                "valid after old jobs are pruned) or a job id",
                                      json_schema_extra={"pattern": page_tokens.PATTERN + "|" + id_pattern("job")})
    limit: int = schemas.Field(default=100, ge=1, le=500)
    resource_id: str | None = schemas.Field(default=None, description="only the jobs of this resource",
                                            json_schema_extra={"pattern": id_pattern(*prefixes())})
    actor: str | None = schemas.Field(default=None, description="only the jobs asked for by this token id "
                                                                 "(`me`: the calling token)",
                                      json_schema_extra={"pattern": "^me$|" + id_pattern("tok")})
    order: str | None = schemas.Field(default=None, json_schema_extra={"enum": ["oldest", "newest"]},
                                      description="`oldest` first (the default) or `newest` first; `next_after` "
                                                  "pages on in the same order")
    status: str | None = schemas.Field(default=None, json_schema_extra={"enum": list(JOB_STATUSES)},
                                       description="only the jobs in this status")
    kind: str | None = schemas.Field(default=None, min_length=1, max_length=63,
                                     description="only the jobs of this kind (e.g. ServerCreate)")
    include_observe: bool = schemas.Field(default=True, description="the periodic observe-only jobs too "
                                                                    "(LoadBalancerObserve, ClusterObserve); "
                                                                    "false leaves them out")


class JobGetQuery(schemas.BaseModel):
    """Query parameters of ``GET /v1/jobs/{id}``."""

    wait_s: int = schemas.Field(default=0, ge=0, le=waiting.MAX_WAIT_S,
                                description="long-poll: answer as soon as the job's status or steps change, or "
                                            "after this many seconds with the job as it is (a terminal job "
                                            "answers at once). A job not yet terminal carries `Retry-After: 5`")


JOB_EXAMPLE: dict[str, Any] = {
    "id": "job_01jd3x5v8q2m6n4p7r9s1t3w5y", "kind": "ServerCreate", "region": "dev-1",
    "resource": {"type": "server", "id": "srv_01jd3x5v8q2m6n4p7r9s1t3w5y"}, "status": "running",
    "attempt": 1, "max_attempts": 10, "run_after": None,
    "steps": [{"name": "clone", "member": None, "state": "done", "started_at": "2026-12-01T04:00:01Z",
               "finished_at": "2026-12-01T04:00:09Z", "detail": {"vmid": 105, "node": "pve1"}},
              {"name": "configure", "member": None, "state": "running", "started_at": "2026-12-01T04:00:09Z",
               "finished_at": None, "detail": {}}],
    "error": None, "created_at": "2026-12-01T04:00:00Z", "started_at": "2026-12-01T04:00:01Z",
    "finished_at": None, "updated_at": "2026-12-01T04:00:09Z",
    "actor": "tok_01jd3x5v8q2m6n4p7r9s1t3w5y", "request_id": "req_01jd3x5v8q2m6n4p7r9s1t3w60",
}

TOKEN_EXAMPLE: dict[str, Any] = {
    "id": "tok_01jd3x5v8q2m6n4p7r9s1t3w5y", "name": "ci", "scopes": ["read", "write"],
    "created_at": "2026-12-01T04:00:00Z", "expires_at": None, "last_used_at": "2026-12-01T04:10:00Z",
    "revoked_at": None, "created_by": "tok_01jd3x5v8q2m6n4p7r9s1t3w60",
}


def operations() -> list[Operation]:
    """Every ``/v1`` operation: the registered resource types', then the jobs', then the tokens'."""
    ops: list[Operation] = []
    for api in RESOURCES:
        ops += resource_operations(api)
        if api.rtype.plan_of is not None:  # a type that says which job converges it can be planned
            ops.append(plans.operation(api))
    ops += [
        Operation("GET", "/jobs", list_jobs, "listJobs", "List jobs, oldest first (order=newest: newest first)", "jobs",
                  {200: schemas.JobList, 401: None, 422: None}, query=JobListQuery,
                  example={"jobs": [JOB_EXAMPLE], "next_after": None}),
        Operation("GET", "/jobs/{id}", waiting.get_job, "getJob", "Get a job: status, attempt, steps, error", "jobs",
                  {200: schemas.Job, 400: None, 401: None, 404: None}, query=JobGetQuery,
                  path_id="the job's id (job_…)", example=JOB_EXAMPLE),
        *job_actions.operations(JOB_EXAMPLE),
        *operator.operations(JOB_EXAMPLE),
        *catalog.operations(),
        quotas.operation(),
        Operation("POST", "/tokens", tokens.create_token, "createToken",
                  "Create an API token for this tenant (its secret is shown once)", "tokens",
                  {201: tokens.TokenCreated, 400: None, 401: None, 403: None, 422: None}, request=tokens.TokenCreate,
                  example={"token": TOKEN_EXAMPLE, "secret": "z9t_…"}),
        Operation("GET", "/tokens", tokens.list_tokens, "listTokens",
                  "List this tenant's tokens (with their last use, coarse)", "tokens",
                  {200: tokens.TokenList, 401: None, 422: None}, query=tokens.TokenListQuery,
                  example={"tokens": [TOKEN_EXAMPLE], "next_after": None}),
        Operation("DELETE", "/tokens/{id}", tokens.revoke_token, "revokeToken", "Revoke a token", "tokens",
                  {200: tokens.TokenRevoked, 401: None, 403: None, 404: None}, path_id="the token's id (tok_…)",
                  example={"token": {**TOKEN_EXAMPLE, "revoked_at": "2026-12-01T05:00:00Z"}}),
    ]
    return ops


def served_document() -> dict[str, Any]:
    """The OpenAPI document the API serves: built once per process for the registered resource
    types (it depends on the code and the registry alone, not on the settings; about 0.1 s of CPU
    that every ``create_app`` paid), shared by the apps of the process, which only read it. Built
    again when the registry holds other objects (a type registered or replaced, in tests): the
    cache keeps the objects it was built for and compares them by identity."""
    global _DOCUMENT
    built_for, document = _DOCUMENT or ((), None)
    if document is None or len(built_for) != len(RESOURCES) or any(a is not b for a, b in zip(built_for, RESOURCES)):
        built_for = tuple(RESOURCES)
        document = openapi_document(operations(), tag_descriptions={
            a.rtype.plural: a.tag_description for a in built_for if a.tag_description})
        _DOCUMENT = (built_for, document)
    return document


_DOCUMENT: tuple[tuple[ApiResource, ...], dict[str, Any]] | None = None


async def openapi(request: web.Request) -> web.Response:
    return web.json_response(request.app[OPENAPI])


async def metrics_endpoint(request: web.Request) -> web.Response:
    """``GET /metrics``: this process's Prometheus metrics (no authentication)."""
    body, content_type = metrics.exposition(request.headers.get("Accept"))
    return web.Response(body=body, headers={"Content-Type": content_type})


async def healthz(request: web.Request) -> web.Response:
    await request.app[POOL].fetchval("SELECT 1")
    return web.json_response({"status": "ok"})


# ---------------------------------------------------------------------------------- factory

def create_app(settings: Settings, *, pool: asyncpg.Pool | None = None, clock: Clock = SYSTEM) -> web.Application:
    """The API application. Owns an asyncpg pool on ``settings.database_url`` unless ``pool``
    is given (tests); reads time through ``clock`` (tests: a :class:`~z9.common.clock.TestClock`)."""
    app = web.Application(middlewares=[middleware.request_id_middleware, metrics_middleware, error_middleware,
                                       tokens.auth_middleware, middleware.rate_limit_middleware,
                                       middleware.query_params_middleware],
                          client_max_size=256 * 1024)
    app[SETTINGS] = settings
    app[CLOCK] = clock

    async def pool_ctx(app: web.Application) -> AsyncIterator[None]:
        app[POOL] = pool if pool is not None else await create_service_pool(
            settings, min_size=2, max_size=settings.api_pool_size, application_name="z9-api")
        app[NOTIFIER] = JobNotifier(app[POOL])
        try:
            async with app[POOL].acquire() as conn:  # the address pools of Z9_REGIONS (migration 0005)
                await address_store.address_pools_sync(conn, settings.regions)
        except BaseException:
            if pool is None:
                await app[POOL].close()
            raise
        yield
        await app[NOTIFIER].flush()
        if pool is None:  # ours to close
            await app[POOL].close()

    app.cleanup_ctx.append(pool_ctx)
    app.cleanup_ctx.append(plans.pve_clients_ctx)
    ops = operations()
    app[OPENAPI] = served_document()
    waiting.install(app, settings, clock)
    app[page_tokens.PAGE_KEYS] = page_tokens.PageKeys.from_settings(settings)
    tokens.install(app)
    # The query-parameter check reads the generated document: every route below is in it.
    middleware.install(app, settings, app[OPENAPI])
    app.router.add_get("/healthz", healthz)
    console.install(app)
    app.router.add_get("/v1/openapi.json", openapi)
    for op in ops:
        if op.method == "GET":  # answers HEAD too (as aiohttp's add_get), so a 405's Allow lists it
            app.router.add_get("/v1" + op.path, op.handler)
        else:
            app.router.add_route(op.method, "/v1" + op.path, op.handler)
    metrics.init_api([(r.method, r.resource.canonical) for r in app.router.routes()
                      if r.resource is not None and r.method != "HEAD"] + [("GET", "/metrics")])
    return app


def create_metrics_app() -> web.Application:
    """``GET /metrics`` of the API process, served on its own listener (``Z9_METRICS_HOST``:
    ``Z9_METRICS_PORT``, like every other z9 service), never on the tenants' port: it has no
    authentication and names the platform's database server."""
    app = web.Application(middlewares=[metrics_middleware])
    app.router.add_get("/metrics", metrics_endpoint)
    return app
