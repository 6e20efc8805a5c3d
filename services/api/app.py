"""aiohttp application factory and handlers of the ``/v1`` API.

Errors are JSON ``{"error": {"code", "message", "details"}}``: 400 malformed JSON, 401 missing or
unknown token, 404 unknown (or another tenant's) resource, 409 a failed precondition (the
message names it), 422 invalid fields (the message names each field). Nothing else ever leaks
as a 500 without being logged once.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import re
import time
from typing import Any, AsyncIterator, Awaitable, Callable

import asyncpg
from aiohttp import web
from pydantic import ValidationError

from z9.common import metrics, store
from z9.common.db import TRANSIENT_DB_ERRORS, create_pool
from z9.common.errors import ApiError, BadRequest, Conflict, NotFound, Unauthorized, ValidationFailed
from z9.common.ids import is_id
from z9.common.models import Job, Server
from z9.common.notify import JobNotifier
from z9.common.settings import Settings
from z9.common.store import NewJob

from .openapi import openapi_document
from .schemas import ServerCreate

log = logging.getLogger("z9.api")

SETTINGS = web.AppKey("settings", Settings)
POOL = web.AppKey("pool", asyncpg.Pool)
NOTIFIER = web.AppKey("notifier", JobNotifier)  # NOTIFY after commit, coalesced (z9.common.notify)
TENANT = web.RequestKey("tenant_id", str)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _error_body(status: int, code: str, message: str, details: Any = None) -> web.Response:
    return web.json_response({"error": {"code": code, "message": message, "details": details}}, status=status)


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
        return _error_body(e.status, e.code, e.message, e.details)
    except TRANSIENT_DB_ERRORS as e:
        log.warning("database unavailable on %s %s: %s", request.method, request.path, e)
        resp = _error_body(503, "unavailable", "the database is unreachable right now; retry shortly")
        resp.headers["Retry-After"] = "2"
        return resp
    except web.HTTPException as e:
        if e.status < 400:
            raise
        return _error_body(e.status, e.reason.lower().replace(" ", "_"), f"{e.reason}: {request.method} {request.path}")
    except Exception:
        log.exception("unhandled error on %s %s", request.method, request.path)
        return _error_body(500, "internal", "internal error; it has been logged")


@web.middleware
async def auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """``Authorization: Bearer <token>`` on every ``/v1`` route; the token's tenant scopes it."""
    if not request.path.startswith("/v1/") or request.path == "/v1/openapi.json":
        return await handler(request)
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("missing bearer token: send 'Authorization: Bearer <token>'")
    tenant = await _token_tenant(request.app, token.strip()) if token.strip().isascii() else None
    if tenant is None:
        raise Unauthorized("unknown or revoked API token")
    request[TENANT] = tenant
    return await handler(request)


TOKEN_CACHE = web.AppKey("token_cache", dict)  # token → (tenant id, monotonic expiry)
_TOKEN_CACHE_MAX = 10_000


async def _token_tenant(app: web.Application, token: str) -> str | None:
    """The token's tenant, remembered for ``api_token_cache_s`` seconds (only known tokens are
    remembered; the cache is emptied when it holds ``_TOKEN_CACHE_MAX`` entries)."""
    ttl = app[SETTINGS].api_token_cache_s
    if ttl <= 0:
        return await store.api_token_tenant(app[POOL], token)
    cache = app[TOKEN_CACHE]
    hit = cache.get(token)
    now = time.monotonic()
    if hit is not None and hit[1] > now:
        return hit[0]
    tenant = await store.api_token_tenant(app[POOL], token)
    if tenant is None:
        cache.pop(token, None)
        return None
    if len(cache) >= _TOKEN_CACHE_MAX:
        cache.clear()
    cache[token] = (tenant, now + ttl)
    return tenant


async def _json_body(request: web.Request) -> Any:
    try:
        raw = await request.read()
        return json.loads(raw or b"null")
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise BadRequest(f"request body is not valid JSON: {e}")


def _validation_error(e: ValidationError) -> ValidationFailed:
    details = []
    for err in e.errors():
        field = ".".join(str(p) for p in err["loc"]) or "body"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown field"
        elif err["type"] == "missing":
            msg = "field required"
        details.append({"field": field, "message": msg})
    text = "; ".join(f"{d['field']}: {d['message']}" for d in details)
    return ValidationFailed(f"invalid request: {text}", details=details)


def _tenant(request: web.Request) -> str:
    return request[TENANT]


def _resource_id(request: web.Request, prefix: str) -> str:
    rid = request.match_info["id"]
    if not is_id(rid, prefix):
        raise NotFound(f"no {'server' if prefix == 'srv' else 'job'} {rid!r}")
    return rid


def _limit(request: web.Request) -> int:
    raw = request.query.get("limit", "100")
    if not re.fullmatch(r"[0-9]{1,3}", raw) or not 1 <= int(raw) <= 500:
        raise ValidationFailed("limit: must be an integer from 1 to 500", details=[{"field": "limit", "message": "1..500"}])
    return int(raw)


# ---------------------------------------------------------------------------------- servers

async def create_server(request: web.Request) -> web.Response:
    settings, pool, tenant = request.app[SETTINGS], request.app[POOL], _tenant(request)
    body = await _json_body(request)
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    try:
        spec = ServerCreate.model_validate(body)
    except ValidationError as e:
        raise _validation_error(e)
    region = settings.regions.get(spec.region)
    if region is None:
        known = ", ".join(sorted(settings.regions)) or "none configured"
        raise ValidationFailed(f"region: unknown region {spec.region!r} (known: {known})",
                               details=[{"field": "region", "message": "unknown region"}])
    if region.images and spec.image not in region.images:
        raise ValidationFailed(f"image: {spec.image!r} is not offered in region {spec.region} "
                               f"(offered: {', '.join(region.images)})",
                               details=[{"field": "image", "message": "unknown image"}])

    key = _idempotency_key(request)
    req_hash = _request_hash("POST /servers", spec.model_dump())
    # Without an Idempotency-Key, server and job go in one statement: atomic on its own, one
    # round trip; with a key, the key's lock and answer share an explicit transaction.
    async with pool.acquire() as conn, (conn.transaction() if key is not None else contextlib.nullcontext()):
        replay = await _idempotency_begin(conn, tenant, key, req_hash)
        if replay is not None:
            return replay
        try:
            server, job = await store.server_insert_with_job(
                conn, tenant_id=tenant, region=spec.region, name=spec.name, image=spec.image,
                cores=spec.cores, memory_mib=spec.memory_mib, disk_gib=spec.disk_gib, ssh_keys=spec.ssh_keys,
                job=NewJob(kind="ServerCreate", region=spec.region, args=spec.model_dump(),
                           max_attempts=settings.max_attempts))
        except asyncpg.UniqueViolationError:
            raise Conflict(f"a server named {spec.name!r} already exists in this tenant; "
                           "choose another name or delete that server first")
        answer = {"server": server.public(), "job": job}
        await _idempotency_end(conn, tenant, key, req_hash, 202, answer)
    request.app[NOTIFIER].notify(server.region)
    return web.json_response(answer, status=202)


# ---------------------------------------------------------------------------------- Idempotency-Key

def _idempotency_key(request: web.Request) -> str | None:
    """The request's ``Idempotency-Key`` (1-255 printable ASCII characters) or None."""
    key = request.headers.get("Idempotency-Key")
    if key is not None and not re.fullmatch(r"[\x21-\x7e]{1,255}", key):
        raise BadRequest("Idempotency-Key must be 1 to 255 printable ASCII characters")
    return key


def _request_hash(route: str, body: Any) -> bytes:
    return hashlib.sha256(json.dumps([route, body], sort_keys=True).encode()).digest()


async def _idempotency_begin(conn: asyncpg.Connection, tenant: str, key: str | None,
                             req_hash: bytes) -> web.Response | None:
    """Inside the request's transaction: serialise requests carrying the same key (advisory
    lock) and return the stored answer to replay, if there is one."""
    if key is None:
        return None
    await store.idempotency_lock(conn, tenant, key)
    prior = await store.idempotency_get(conn, tenant, key)
    return _replay(prior, req_hash) if prior is not None else None


async def _idempotency_end(conn: asyncpg.Connection, tenant: str, key: str | None, req_hash: bytes,
                           status: int, answer: Any) -> None:
    """Store the answer under the key, in the transaction that made it."""
    if key is not None:
        await store.idempotency_insert(conn, tenant, key, req_hash, status, answer)


def _replay(prior: Any, req_hash: bytes) -> web.Response:
    if bytes(prior["request_sha256"]) != req_hash:
        raise ValidationFailed("Idempotency-Key was already used with a different request body",
                               details=[{"field": "Idempotency-Key", "message": "reused"}])
    return web.json_response(prior["response_body"], status=prior["response_status"],
                             headers={"Idempotent-Replayed": "true"})


async def list_servers(request: web.Request) -> web.Response:
    after = request.query.get("after")
    if after is not None and not is_id(after, "srv"):
        raise ValidationFailed(f"after: {after!r} is not a server id",
                               details=[{"field": "after", "message": "not a server id"}])
    status = request.query.get("status")
    statuses = ("creating", "running", "stopped", "deleting", "destroying", "deleted", "failed")
    if status is not None and status not in statuses:
        raise ValidationFailed(f"status: must be one of {', '.join(statuses)}",
                               details=[{"field": "status", "message": "unknown status"}])
    limit = _limit(request)
    servers = await store.server_list(request.app[POOL], _tenant(request), after=after, status=status, limit=limit)
    return web.json_response({"servers": [s.public() for s in servers],
                              "next_after": servers[-1].id if len(servers) == limit else None})


async def get_server(request: web.Request) -> web.Response:
    sid = _resource_id(request, "srv")
    server = await store.server_get(request.app[POOL], sid, _tenant(request))
    if server is None:
        raise NotFound(f"no server {sid!r}")
    return web.json_response({"server": server.public()})


async def delete_server(request: web.Request) -> web.Response:
    settings, pool, tenant = request.app[SETTINGS], request.app[POOL], _tenant(request)
    sid = _resource_id(request, "srv")
    async with pool.acquire() as conn, conn.transaction():
        server = await store.server_mark_deleting(conn, sid, tenant, settings.deletion_buffer_s)
        if server is None:
            current = await store.server_get(conn, sid, tenant)
            if current is None:
                raise NotFound(f"no server {sid!r}")
            raise Conflict(_not_deletable(current.id, current.status))
        await _room_for_a_job(conn, settings, server.id)
        job = await store.job_insert(conn, NewJob(
            kind="ServerStop", region=server.region, tenant_id=tenant, resource_type="server",
            resource_id=server.id, max_attempts=settings.max_attempts), notify=False)
    request.app[NOTIFIER].notify(job.region)
    return web.json_response({"server": server.public(), "job": job.brief()}, status=202)


async def _room_for_a_job(conn: Any, settings: Settings, sid: str) -> None:
    """Raise Conflict (409) when server ``sid`` already has ``max_live_jobs_per_resource`` live
    jobs. Called after the server row's update, which holds its lock until commit, so concurrent
    requests for one server count one after the other; the Conflict rolls that update back."""
    live = await store.job_count_live_for_resource(conn, sid)
    if live >= settings.max_live_jobs_per_resource:
        raise Conflict(f"server {sid} already has {live} jobs waiting or running; "
                       "retry once they have finished (GET /v1/jobs?resource_id=...)")


def _not_deletable(sid: str, status: str) -> str:
    if status == "deleting":
        return f"server {sid} is deleting; cancel the deletion or wait"
    if status == "destroying":
        return f"server {sid} is being destroyed; its deletion buffer has expired"
    return f"server {sid} is {status}; it cannot be deleted again"


async def cancel_deletion(request: web.Request) -> web.Response:
    settings, pool, tenant = request.app[SETTINGS], request.app[POOL], _tenant(request)
    sid = _resource_id(request, "srv")
    key = _idempotency_key(request)
    req_hash = _request_hash("POST /servers/{id}/actions/cancel-deletion", sid)
    async with pool.acquire() as conn, conn.transaction():
        replay = await _idempotency_begin(conn, tenant, key, req_hash)
        if replay is not None:
            return replay
        server = await store.server_cancel_deletion(conn, sid, tenant)
        if server is None:
            current = await store.server_get(conn, sid, tenant)
            if current is None:
                raise NotFound(f"no server {sid!r}")
            if current.status == "deleting":
                raise Conflict(f"server {sid}: the deletion buffer expired at "
                               f"{current.public()['delete_after']}; the deletion can no longer be cancelled")
            if current.status in ("destroying", "deleted"):
                raise Conflict(f"server {sid} is {current.status}: the deletion buffer has expired and "
                               "the deletion can no longer be cancelled")
            raise Conflict(f"server {sid} is {current.status}, not deleting: there is no deletion to cancel")
        await _room_for_a_job(conn, settings, server.id)
        kind, args = _restore_job(server)
        job = await store.job_insert(conn, NewJob(
            kind=kind, region=server.region, tenant_id=tenant, resource_type="server",
            resource_id=server.id, args=args, max_attempts=settings.max_attempts), notify=False)
        answer = {"server": server.public(), "job": job.brief()}
        await _idempotency_end(conn, tenant, key, req_hash, 202, answer)
    request.app[NOTIFIER].notify(job.region)
    return web.json_response(answer, status=202)


def _restore_job(server: Server) -> tuple[str, dict[str, Any]]:
    """The job that gives a server back what it had before its deletion, from its status then:
    a server still being created is created (the ServerCreate re-runs: it converges and starts
    the VM), a running one is started, a stopped one stays stopped, a failed one gets the power
    state it had."""
    before, power_before = server.status_before_delete, server.power_before_delete
    if before == "creating":
        return "ServerCreate", {"name": server.name, "region": server.region, "image": server.image,
                                "cores": server.cores, "memory_mib": server.memory_mib,
                                "disk_gib": server.disk_gib, "ssh_keys": list(server.ssh_keys)}
    if before == "running" or (before == "failed" and power_before == "running"):
        return "ServerStart", {}
    return "ServerStop", {}


# ---------------------------------------------------------------------------------- jobs

async def get_job(request: web.Request) -> web.Response:
    jid = _resource_id(request, "job")
    job = await store.job_get(request.app[POOL], jid, _tenant(request))
    if job is None:
        raise NotFound(f"no job {jid!r}")
    return web.json_response(job.public())


async def list_jobs(request: web.Request) -> web.Response:
    rid = request.query.get("resource_id")
    if rid is not None and not is_id(rid):
        raise ValidationFailed(f"resource_id: {rid!r} is not a resource id",
                               details=[{"field": "resource_id", "message": "not a resource id"}])
    after = request.query.get("after")
    after_seq = None
    pool, tenant = request.app[POOL], _tenant(request)
    if after is not None:
        ref = await store.job_get(pool, after, tenant) if is_id(after, "job") else None
        if ref is None:
            raise ValidationFailed(f"after: no job {after!r}", details=[{"field": "after", "message": "unknown job"}])
        after_seq = ref.seq
    limit = _limit(request)
    jobs: list[Job] = await store.job_list(pool, tenant, resource_id=rid, after_seq=after_seq, limit=limit)
    return web.json_response({"jobs": [j.public() for j in jobs],
                              "next_after": jobs[-1].id if len(jobs) == limit else None})


async def openapi(request: web.Request) -> web.Response:
    return web.json_response(openapi_document())


async def metrics_endpoint(request: web.Request) -> web.Response:
    """``GET /metrics``: this process's Prometheus metrics (no authentication)."""
    body, content_type = metrics.exposition(request.headers.get("Accept"))
    return web.Response(body=body, headers={"Content-Type": content_type})


async def healthz(request: web.Request) -> web.Response:
    await request.app[POOL].fetchval("SELECT 1")
    return web.json_response({"status": "ok"})


# ---------------------------------------------------------------------------------- factory

def create_app(settings: Settings, *, pool: asyncpg.Pool | None = None) -> web.Application:
    """The API application. Owns an asyncpg pool on ``settings.database_url`` unless ``pool``
    is given (tests)."""
    app = web.Application(middlewares=[metrics_middleware, error_middleware, auth_middleware],
                          client_max_size=256 * 1024)
    app[SETTINGS] = settings
    app[TOKEN_CACHE] = {}

    async def pool_ctx(app: web.Application) -> AsyncIterator[None]:
        app[POOL] = pool if pool is not None else await create_pool(
            settings.require_database_url(), min_size=2, max_size=16, application_name="z9-api")
        app[NOTIFIER] = JobNotifier(app[POOL])
        try:
            async with app[POOL].acquire() as conn:  # the address pools of Z9_REGIONS (migration 0005)
                await store.address_pools_sync(conn, settings.regions)
        except BaseException:
            if pool is None:
                await app[POOL].close()
            raise
        yield
        await app[NOTIFIER].flush()
        if pool is None:  # ours to close
            await app[POOL].close()

    app.cleanup_ctx.append(pool_ctx)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/v1/openapi.json", openapi)
    app.router.add_post("/v1/servers", create_server)
    app.router.add_get("/v1/servers", list_servers)
    app.router.add_get("/v1/servers/{id}", get_server)
    app.router.add_delete("/v1/servers/{id}", delete_server)
    app.router.add_post("/v1/servers/{id}/actions/cancel-deletion", cancel_deletion)
    app.router.add_get("/v1/jobs", list_jobs)
    app.router.add_get("/v1/jobs/{id}", get_job)
    app.router.add_get("/metrics", metrics_endpoint)
    metrics.init_api((r.method, r.resource.canonical) for r in app.router.routes()
                     if r.resource is not None and r.method != "HEAD")
    return app
