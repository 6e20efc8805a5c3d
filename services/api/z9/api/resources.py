"""Generic API handlers for every resource type, and the operation table the OpenAPI document is
generated from.

A resource type's API registration is an :class:`ApiResource`: the type from the registry
(``z9.resources``), its create body and public models (pydantic), an example, and a
``create`` hook that writes the row and its job. :func:`resource_operations` turns it into five
:class:`Operation`\\ s — create, list, get, delete, cancel-deletion (buffered deletion only) —
served by the generic handlers below and described by :mod:`z9.api.openapi`. A type's own routes
(actions such as assign) are :class:`Operation`\\ s too, so the document covers them the same way.
"""
from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

import asyncpg
from aiohttp import web
from pydantic import BaseModel, Field, ValidationError, create_model

from z9 import resources
from z9.common import labels, store
from z9.common.errors import BadRequest, CheckViolation, Conflict, NotFound, ValidationFailed, deleting
from z9.common.ids import id_pattern, is_id
from z9.common.notify import JobNotifier
from z9.resources import Buffered, Immediate, ResourceType
from z9.common.clock import SYSTEM, Clock
from z9.common.settings import Settings

from . import schemas

SETTINGS = web.AppKey("settings", Settings)
CLOCK = web.AppKey("clock", Clock)  # any Clock (z9.common.clock): token expiry, deletion buffers
POOL = web.AppKey("pool", asyncpg.Pool)
NOTIFIER = web.AppKey("notifier", JobNotifier)  # NOTIFY after commit, coalesced (z9.common.notify)
TENANT = web.RequestKey("tenant_id", str)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]



def _a(noun: str) -> str:
    """``noun`` with its article: "an address", "a server" (the type names z9 has; by the first letter)."""
    return f"{'an' if noun[:1] in 'aeiou' else 'a'} {noun}"

def clock_of(app: web.Application) -> Clock:
    """The application's clock (:func:`z9.api.app.create_app`'s ``clock``; the real one by default)."""
    return app.get(CLOCK, SYSTEM)


@dataclass
class Operation:
    """One route: its handler and what the OpenAPI document says about it. ``responses`` maps a
    status to its body model (None: the generic Error); ``query`` is a model whose fields are the
    query parameters; ``example`` the success body's example."""

    method: str
    path: str  # below /v1, e.g. "/servers/{id}"
    handler: Handler
    operation_id: str
    summary: str
    tag: str
    responses: dict[int, type[BaseModel] | None]
    request: type[BaseModel] | None = None
    query: type[BaseModel] | None = None
    path_id: str | None = None  # the {id} parameter's description
    idempotent: bool = False  # takes an Idempotency-Key
    example: Any = None
    description: str = ""
    deprecated: bool = False  # an old path kept as an alias (the document marks it deprecated)


@dataclass
class CreateContext:
    """What a type's ``create`` hook gets: the connection (in a transaction when the type asked
    for one, or when an Idempotency-Key is given), settings and the caller's tenant."""

    conn: asyncpg.Connection
    settings: Settings
    tenant_id: str
    # job briefs the hook made besides the one it returns (a server's AddressAssign): the
    # answer's ``jobs`` lists them after it
    more_jobs: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class ApiResource:
    """A resource type's API registration.

    ``create(ctx, spec) -> (row, job brief {id, kind, status})`` writes the row and its job (a
    409 for a taken name, …); ``check(settings, spec)`` validates what the model cannot (a 422
    naming the field) before any database work; ``transactional`` runs ``create`` in a
    transaction (several statements); ``example`` is a public row (the document's examples)."""

    rtype: ResourceType[Any]
    create_model: type[BaseModel]
    public_model: type[BaseModel]
    create: Callable[[CreateContext, Any], Awaitable[tuple[Any, dict[str, Any]]]]
    example: dict[str, Any]
    check: Callable[[Settings, Any], None] | None = None
    transactional: bool = False
    actions: Callable[["ApiResource"], list[Operation]] | None = None  # the type's own routes
    # More list filters than after/limit/status: a model of the extra query parameters (strings
    # validated by it, 422 naming the parameter) and the query that applies them:
    # ``list_rows(db, tenant_id, filters, after=, status=, limit=, name=, selector=) -> rows``.
    list_filters: type[BaseModel] | None = None
    list_rows: Callable[..., Awaitable[list[Any]]] | None = None
    tag_description: str = ""
    models: dict[str, type[BaseModel]] = field(default_factory=dict)  # filled by resource_operations
    # what GET and list add to rows before their public shape (a firewall's member rows):
    # ``enrich(db, rows) -> rows``
    enrich: Callable[[Any, list[Any]], Awaitable[list[Any]]] | None = None

    @property
    def name(self) -> str:
        return self.rtype.name

    def public(self, row: Any) -> dict[str, Any]:
        """The row's public JSON, through the public model."""
        return self.public_model.model_validate(row.public()).model_dump(mode="json", by_alias=True)


# ---------------------------------------------------------------------------------- helpers

def tenant(request: web.Request) -> str:
    return request[TENANT]


def _number(text: str) -> float | int:
    """A JSON number written with a fraction or exponent: an int when it has no fractional part
    (``7647.0``, ``1e3``), as JSON Schema's ``integer`` counts it; the document's integer fields
    then accept what it allows (strict models still refuse ``2.5``, ``"2"`` and ``true``)."""
    value = float(text)
    return int(value) if value.is_integer() else value


async def json_body(request: web.Request) -> Any:
    import json

    try:
        raw = await request.read()
        return json.loads(raw or b"null", parse_float=_number)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise BadRequest(f"request body is not valid JSON: {e}")


def validation_error(e: ValidationError) -> ValidationFailed:
    details = []
    for err in e.errors():
        field_ = ".".join(str(p) for p in err["loc"]) or "body"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown field"
        elif err["type"] == "missing":
            msg = "field required"
        elif err["type"] == "string_pattern_mismatch" and schemas.pattern_words(str((err.get("ctx") or {}).get("pattern"))):
            msg = "must be " + str(schemas.pattern_words(str(err["ctx"]["pattern"])))
        details.append({"field": field_, "message": msg})
    text = "; ".join(f"{d['field']}: {d['message']}" for d in details)
    return ValidationFailed(f"invalid request: {text}", details=details)


async def parse_body(request: web.Request, model: type[BaseModel]) -> Any:
    """The request's JSON object validated by ``model`` (400 not JSON/not an object, 422 fields)."""
    body = await json_body(request)
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    try:
        return model.model_validate(body)
    except ValidationError as e:
        raise validation_error(e)


def path_id(request: web.Request, prefix: str, name: str) -> str:
    """The ``{id}`` of the path, 404 when it is not an id of ``prefix``."""
    rid = request.match_info["id"]
    if not is_id(rid, prefix):
        raise NotFound(f"no {name} {rid!r}")
    return rid


def limit_param(request: web.Request) -> int:
    raw = request.query.get("limit", "100")
    if not re.fullmatch(r"[0-9]{1,3}", raw) or not 1 <= int(raw) <= 500:
        raise ValidationFailed("limit: must be an integer from 1 to 500", details=[{"field": "limit", "message": "1..500"}])
    return int(raw)


def bool_param(request: web.Request, name: str, *, default: bool) -> bool:
    """A boolean query parameter: ``true`` or ``false`` (else 422 naming it); ``default`` when absent."""
    raw = request.query.get(name)
    if raw is None:
        return default
    if raw not in ("true", "false"):
        raise ValidationFailed(f"{name}: must be true or false", details=[{"field": name, "message": "true or false"}])
    return raw == "true"


def check_region(settings: Settings, region: str) -> None:
    """422 naming the field when ``region`` is not configured."""
    if region not in settings.regions:
        known = ", ".join(sorted(settings.regions)) or "none configured"
        raise ValidationFailed(f"region: unknown region {region!r} (known: {known})",
                               details=[{"field": "region", "message": "unknown region"}])


def dump(model: type[BaseModel], body: dict[str, Any]) -> dict[str, Any]:
    """``body`` through ``model`` (validated, in its JSON form)."""
    return model.model_validate(body).model_dump(mode="json", by_alias=True)


async def room_for_a_job(conn: Any, settings: Settings, name: str, rid: str) -> None:
    """Raise Conflict (409) when resource ``rid`` already has ``max_live_jobs_per_resource`` live
    jobs. Called after the resource row's update, which holds its lock until commit, so
    concurrent requests for one resource count one after the other; the Conflict rolls that
    update back."""
    live = await store.resource_count_live_jobs(conn, rid)
    if live >= settings.max_live_jobs_per_resource:
        raise Conflict(f"{name} {rid} already has {live} jobs waiting or running; "
                       "retry once they have finished (GET /v1/jobs?resource_id=...)", code="too_many_jobs",
                       details={"kind": name, "id": rid, "limit": settings.max_live_jobs_per_resource})


ActionChange = Callable[[Any, Settings, str, str], Awaitable[tuple[Any, str, "dict[str, Any] | None", tuple[str, ...]]]]
"""What an action changes, in its transaction: ``change(conn, settings, tenant id, resource id)
-> (row, job kind, job args, extra lock keys)`` — locks and checks the row (404, 409), writes its
new intent, and names the job that makes it true."""


async def action_transaction(request: web.Request, rtype: Any, route: str, body: Any, change: ActionChange, *,
                             accepted: type[BaseModel], reread: bool = False) -> web.Response:
    """The one transaction of every resource action (``POST /v1/<plural>/{id}/actions/<verb>``):
    the path id (404 when not one of the type's), the Idempotency-Key (a replay answers as the
    first request did), the type's ``change``, room for one more live job (409), the job itself,
    the 202 answer ``{<type>: row, job}`` stored for replays — one commit — and NOTIFY after it,
    with ``Location: /v1/jobs/{id}``. ``reread``: the row is read again after the job's insert
    (what its insert changed on the row shows in the answer)."""
    settings, pool, tenant_id = request.app[SETTINGS], request.app[POOL], tenant(request)
    noun = rtype.name.replace("_", " ")
    rid = path_id(request, rtype.prefix, noun)
    key = idempotency_key(request)
    req_hash = request_hash(route, [rid, body])
    async with pool.acquire() as conn, conn.transaction():
        replay = await idempotency_begin(conn, tenant_id, key, req_hash)
        if replay is not None:
            return replay
        row, kind, args, extra = await change(conn, settings, tenant_id, rid)
        await room_for_a_job(conn, settings, noun, row.id)
        job = await store.job_insert(conn, rtype.new_job(row, kind, args=args, extra_lock_keys=extra,
                                                         max_attempts=settings.max_attempts), notify=False)
        if reread:
            row = await rtype.get(conn, row.id)
        answer = dump(accepted, {rtype.name: row.public(), "job": job.brief()})
        await idempotency_end(conn, tenant_id, key, req_hash, 202, answer)
    request.app[NOTIFIER].notify(job.region)
    return web.json_response(answer, status=202, headers={"Location": f"/v1/jobs/{job.id}"})


# ---------------------------------------------------------------------------------- Idempotency-Key

def idempotency_key(request: web.Request) -> str | None:
    """The request's ``Idempotency-Key`` (1-255 printable ASCII characters) or None."""
    key = request.headers.get("Idempotency-Key")
    if key is not None and not re.fullmatch(r"[\x21-\x7e]{1,255}", key):
        raise BadRequest("Idempotency-Key must be 1 to 255 printable ASCII characters")
    return key


def request_hash(route: str, body: Any) -> bytes:
    import hashlib
    import json

    return hashlib.sha256(json.dumps([route, body], sort_keys=True).encode()).digest()


async def idempotency_begin(conn: asyncpg.Connection, tenant_id: str, key: str | None,
                            req_hash: bytes) -> web.Response | None:
    """Inside the request's transaction: serialise requests carrying the same key (advisory
    lock) and return the stored answer to replay, if there is one."""
    if key is None:
        return None
    await store.idempotency_lock(conn, tenant_id, key)
    prior = await store.idempotency_get(conn, tenant_id, key)
    return _replay(prior, req_hash) if prior is not None else None


async def idempotency_end(conn: asyncpg.Connection, tenant_id: str, key: str | None, req_hash: bytes,
                          status: int, answer: Any) -> None:
    """Store the answer under the key, in the transaction that made it."""
    if key is not None:
        await store.idempotency_insert(conn, tenant_id, key, req_hash, status, answer)


def _replay(prior: Any, req_hash: bytes) -> web.Response:
    if bytes(prior["request_sha256"]) != req_hash:
        raise ValidationFailed("Idempotency-Key was already used with a different request body",
                               details=[{"field": "Idempotency-Key", "message": "reused"}])
    return web.json_response(prior["response_body"], status=prior["response_status"],
                             headers={"Idempotent-Replayed": "true"})


# ---------------------------------------------------------------------------------- generic handlers



def _rule_message(e: Exception) -> str:
    """The trigger's own message (the translated error's text, without PostgreSQL's prefix)."""
    return str(e).split("\n")[0]


def _not_deletable(name: str, rid: str, status: str, *, immediate: bool = False) -> str:
    if status == "deleting":
        return f"{name} {rid} is deleting; cancel the deletion or wait"
    if status == "destroying":
        if immediate:  # no buffer ever ran (a cluster): the one DELETE already under way goes on
            return f"{name} {rid} is already being destroyed (its deletion runs; follow its job)"
        return f"{name} {rid} is being destroyed; its deletion buffer has expired"
    return f"{name} {rid} is {status}; it cannot be deleted again"


async def _name_taken(pool: Any, rt: ResourceType[Any], tenant_id: str, name: str, e: Conflict) -> Conflict:
    """A create's 409 ``uniqueness_error`` (after its transaction rolled back), saying what holds
    the name: a resource being deleted holds it until it is ``deleted`` — when that is, and how to
    free the name now (rename the deleting one: PATCH works until it is deleted)."""
    holders = [r for r in await rt.list(pool, tenant_id, name=name, limit=10) if r.status != "deleted"]
    if not holders:
        return e
    h = holders[0]
    public = h.public()
    item = f"/v1/{rt.plural}/{h.id}"
    if h.status == "deleting":
        text = (f"{_a(rt.name)} named {name!r} already exists in this tenant: {h.id}, being deleted; the name is free "
                f"once it is deleted, after its deletion buffer ends at {public.get('delete_after')}. To free the "
                f"name now, rename it (PATCH {item} with another name), or restore it "
                f"(POST {item}/actions/cancel-deletion)")
    elif h.status == "destroying":
        text = (f"{_a(rt.name)} named {name!r} already exists in this tenant: {h.id}, being destroyed; the name is "
                f"free as soon as its deletion job ends (GET /v1/jobs?resource_id={h.id})"
                + (f", or now if you rename it (PATCH {item})" if isinstance(rt.deletion, Buffered) else ""))
    else:
        return Conflict(e.message, code=e.code, details=[{"kind": rt.name, "id": h.id, "status": h.status}])
    return Conflict(text, code=e.code, details=[{"kind": rt.name, "id": h.id, "status": h.status,
                                                 "free_after": public.get("delete_after")}])


def _create_handler(api: ApiResource, accepted: type[BaseModel]) -> Handler:
    rt = api.rtype

    async def create(request: web.Request) -> web.Response:
        settings, pool, tenant_id = request.app[SETTINGS], request.app[POOL], tenant(request)
        spec = await parse_body(request, api.create_model)
        if hasattr(spec, "region"):
            check_region(settings, spec.region)
        if api.check is not None:
            api.check(settings, spec)
        key = idempotency_key(request)
        req_hash = request_hash(f"POST /{rt.plural}", spec.model_dump())
        # Without an Idempotency-Key (and for a type whose create is one statement) row and job
        # go in one statement: atomic on its own, one round trip; otherwise the key's lock and
        # answer share an explicit transaction with the writes.
        tx = key is not None or api.transactional or bool(resources.CREATE_HOOKS.get(rt.name))
        try:
            async with pool.acquire() as conn, (conn.transaction() if tx else contextlib.nullcontext()):
                replay = await idempotency_begin(conn, tenant_id, key, req_hash)
                if replay is not None:
                    return replay
                ctx = CreateContext(conn, settings, tenant_id)
                row, job = await api.create(ctx, spec)
                # dependents reacting in the same transaction (a server's networks, a firewall whose selector takes it)
                more = await resources.create_dependents(conn, rt.name, row, spec, settings)
                ctx.more_jobs.extend(j.brief() for j in more)
                answer = dump(accepted, {rt.name: row.public(), "job": job, "jobs": [job, *ctx.more_jobs]})
                await idempotency_end(conn, tenant_id, key, req_hash, 202, answer)
        except Conflict as e:
            if e.code != "uniqueness_error" or not isinstance(getattr(spec, "name", None), str):
                raise
            raise await _name_taken(pool, rt, tenant_id, spec.name, e) from None
        request.app[NOTIFIER].notify(row.region)
        return web.json_response(answer, status=202)

    return create


def _list_handler(api: ApiResource, page: type[BaseModel]) -> Handler:
    rt = api.rtype

    async def list_(request: web.Request) -> web.Response:
        after = request.query.get("after")
        if after is not None and not is_id(after, rt.prefix):
            raise ValidationFailed(f"after: {after!r} is not {_a(rt.name)} id",
                                   details=[{"field": "after", "message": f"not {_a(rt.name)} id"}])
        status = request.query.get("status")
        if status is not None and status not in rt.statuses:
            raise ValidationFailed(f"status: must be one of {', '.join(rt.statuses)}",
                                   details=[{"field": "status", "message": "unknown status"}])
        limit = limit_param(request)
        name, selector = request.query.get("name"), None
        if name is not None and not 1 <= len(name) <= 63:
            raise ValidationFailed("name: 1 to 63 characters", details=[{"field": "name", "message": "1..63 characters"}])
        if "label_selector" in request.query:
            try:
                selector = labels.parse(request.query["label_selector"])
            except ValueError as e:
                raise ValidationFailed(f"label_selector: {e}", details=[{"field": "label_selector", "message": str(e)}])
        include_deleted = bool_param(request, "include_deleted", default=name is None) or status == "deleted"
        if api.list_filters is not None and api.list_rows is not None:
            given = {k: v for k, v in request.query.items() if k in api.list_filters.model_fields}
            try:
                filters = api.list_filters.model_validate(given)
            except ValidationError as e:
                raise validation_error(e)
            rows = await api.list_rows(request.app[POOL], tenant(request), filters, after=after, status=status,
                                       limit=limit, name=name, selector=selector, include_deleted=include_deleted)
        else:
            rows = await rt.list(request.app[POOL], tenant(request), after=after, status=status, limit=limit,
                                 name=name, selector=selector, include_deleted=include_deleted)
        if api.enrich is not None:
            rows = await api.enrich(request.app[POOL], rows)
        return web.json_response(dump(page, {rt.plural.replace("-", "_"): [r.public() for r in rows],
                                             "next_after": rows[-1].id if len(rows) == limit else None}))

    return list_


def _get_handler(api: ApiResource, one: type[BaseModel]) -> Handler:
    rt = api.rtype

    async def get(request: web.Request) -> web.Response:
        rid = path_id(request, rt.prefix, rt.name)
        row = await rt.get(request.app[POOL], rid, tenant(request))
        if row is None:
            raise NotFound(f"no {rt.name} {rid!r}")
        if api.enrich is not None:
            [row] = await api.enrich(request.app[POOL], [row])
        return web.json_response(dump(one, {rt.name: row.public()}))

    return get


def _delete_handler(api: ApiResource, accepted: type[BaseModel]) -> Handler:
    rt = api.rtype
    first_kind = rt.deletion.first_kind if isinstance(rt.deletion, Buffered) else rt.final_kind

    async def delete(request: web.Request) -> web.Response:
        settings, pool, tenant_id = request.app[SETTINGS], request.app[POOL], tenant(request)
        rid = path_id(request, rt.prefix, rt.name)
        for options in resources.DELETION_OPTIONS.get(rt.name, []):  # before any database work
            try:
                options.model_validate({k: v for k, v in request.query.items() if k in options.model_fields})
            except ValidationError as e:
                raise validation_error(e)
        async with pool.acquire() as conn, conn.transaction():
            # a failed create (its create job failed, none succeeded) holds nothing to keep: no
            # buffer, straight to the final job; its name is free once it is deleted
            kind = first_kind
            immediate = False
            if isinstance(rt.deletion, Buffered):
                before = await rt.get(conn, rid, tenant_id)
                if (before is not None and before.status == "failed"
                        and await store.resource_create_failed(conn, rid, rt.kinds[0])):
                    kind, immediate = rt.final_kind, True
            try:
                row = await rt.mark_deleting(conn, rid, tenant_id, settings.deletion_buffer_s, immediate=immediate,
                                             now=clock_of(request.app).db_now())
            except CheckViolation as e:
                # a table's own deletion rule refused: its constraint is named <table>_<code>
                # (addresses_protected → 409 protected, addresses_must_be_unassigned → …)
                name = e.constraint
                if name.startswith(rt.table + "_") and name[len(rt.table) + 1:] in rt.deletion_rules:
                    raise Conflict(_rule_message(e), code=name[len(rt.table) + 1:]) from e
                raise
            if row is None:
                current = await rt.get(conn, rid, tenant_id)
                if current is None:
                    raise NotFound(f"no {rt.name} {rid!r}")
                raise Conflict(_not_deletable(rt.name, current.id, current.status,
                                              immediate=isinstance(rt.deletion, Immediate)),
                               **deleting(rt.name, current.id, current.status))
            await room_for_a_job(conn, settings, rt.name, row.id)
            job = await store.job_insert(conn, rt.new_job(row, kind, max_attempts=settings.max_attempts),
                                         notify=False)
            # an immediate deletion ends the resource's waiting jobs it supersedes now (a running
            # one stops at its next step): it never waits behind a create's backoff
            await rt.supersede_waiting(conn, row.id, job.id, kind)
            # what depends on it reacts in this transaction (hooks the dependent types registered)
            more = await resources.deletion_dependents(conn, rt.name, row, request.query, settings)
        request.app[NOTIFIER].notify(job.region)
        return web.json_response(dump(accepted, {rt.name: row.public(), "job": job.brief(),
                                                 "jobs": [job.brief(), *(j.brief() for j in more)]}), status=202)

    return delete


def _cancel_handler(api: ApiResource, accepted: type[BaseModel]) -> Handler:
    rt = api.rtype
    assert rt.restore is not None

    async def cancel_deletion(request: web.Request) -> web.Response:
        settings, pool, tenant_id = request.app[SETTINGS], request.app[POOL], tenant(request)
        rid = path_id(request, rt.prefix, rt.name)
        key = idempotency_key(request)
        req_hash = request_hash(f"POST /{rt.plural}/{{id}}/actions/cancel-deletion", rid)
        async with pool.acquire() as conn, conn.transaction():
            replay = await idempotency_begin(conn, tenant_id, key, req_hash)
            if replay is not None:
                return replay
            if rt.lock_before_restore is not None:
                await rt.lock_before_restore(conn, rid, tenant_id)  # other types' rows first, e.g. the server
            row = await rt.cancel_deletion(conn, rid, tenant_id, now=clock_of(request.app).db_now())
            if row is None:
                current = await rt.get(conn, rid, tenant_id)
                if current is None:
                    raise NotFound(f"no {rt.name} {rid!r}")
                if current.status == "deleting":
                    raise Conflict(f"{rt.name} {rid}: the deletion buffer expired at "
                                   f"{current.public()['delete_after']}; the deletion can no longer be cancelled",
                                   code="deletion_expired", details=[{"kind": rt.name, "id": rid, "status": current.status}])
                if current.status in ("destroying", "deleted"):
                    raise Conflict(f"{rt.name} {rid} is {current.status}: the deletion buffer has expired and "
                                   "the deletion can no longer be cancelled", code="deletion_expired",
                                   details=[{"kind": rt.name, "id": rid, "status": current.status}])
                raise Conflict(f"{rt.name} {rid} is {current.status}, not deleting: there is no deletion to cancel",
                               code="not_deleting", details=[{"kind": rt.name, "id": rid, "status": current.status}])
            await room_for_a_job(conn, settings, rt.name, row.id)
            kind, args = rt.restore(row)
            job = await store.job_insert(conn, rt.new_job(row, kind, args=args, max_attempts=settings.max_attempts),
                                         notify=False)
            more = await resources.restore_dependents(conn, rt.name, row, settings)  # e.g. a server's volumes back
            answer = dump(accepted, {rt.name: row.public(), "job": job.brief(),
                                     "jobs": [job.brief(), *(j.brief() for j in more)]})
            await idempotency_end(conn, tenant_id, key, req_hash, 202, answer)
        request.app[NOTIFIER].notify(job.region)
        return web.json_response(answer, status=202)

    return cancel_deletion


class ListQuery(BaseModel):
    """Query parameters of a list: a page after an id, of one status."""

    after: str | None = Field(default=None, description="id of the last item of the previous page")
    limit: int = Field(default=100, ge=1, le=500)
    name: str | None = Field(default=None, min_length=1, max_length=63, description="only the one of this name")
    label_selector: str | None = Field(default=None, max_length=4096,
                                       json_schema_extra={"pattern": labels.SELECTOR_PATTERN},
                                       description="only those whose labels match: comma-separated requirements "
                                                   "`k=v`, `k!=v`, `k`, `!k`, `k in (a,b)` (all must hold)")
    include_deleted: bool | None = Field(default=None, description="list the deleted ones too (default: true, "
                                                                   "but false with `name`: a name lookup finds "
                                                                   "what is there now; `status=deleted` lists "
                                                                   "them either way)")


def resource_operations(api: ApiResource) -> list[Operation]:
    """The five generic operations of a resource type (four when its deletion is immediate)."""
    rt, public = api.rtype, api.public_model
    cap = "".join(p.capitalize() for p in rt.name.split("_"))
    # a plural path segment may hold dashes (load-balancers); JSON keys and model names do not
    plural_cap = "".join(p.capitalize() for p in rt.plural.replace("-", "_").split("_"))
    accepted = create_model(f"{cap}Accepted", __base__=schemas.Accepted,
                            __doc__=f"Accepted: the {rt.name}, its job and every job the request made (jobs); "
                                    "the request is done when they have all succeeded.",
                            **{rt.name: (public, ...), "job": (schemas.JobRef, ...)})
    one = create_model(f"{cap}Envelope", __base__=schemas.Response, __doc__=f"One {rt.name}.",
                       **{rt.name: (public, ...)})
    page = create_model(f"{plural_cap}Page", __base__=schemas.Response, __doc__=f"A page of {rt.plural}, by id.",
                        **{rt.plural.replace("-", "_"): (list[public], ...),
                           "next_after": (str | None, Field(description="pass as `after` for the next page; "
                                                                         "null on the last"))})
    status_enum = create_model(f"{plural_cap}ListQuery", __base__=(ListQuery, *( [api.list_filters] if api.list_filters else [])),
                               status=(str | None, Field(default=None, json_schema_extra={"enum": list(rt.statuses)},
                                                         description=f"only {rt.plural} in this status")),
                               after=(str | None, Field(default=None, json_schema_extra={"pattern": id_pattern(rt.prefix)},
                                                        description=f"id of the last {rt.name} of the previous page")))
    api.models = {"accepted": accepted, "one": one, "page": page}
    job_ref = {"id": "job_01jd3x5v8q2m6n4p7r9s1t3w5y", "kind": "", "status": "pending"}
    base, item = f"/{rt.plural}", f"/{rt.plural}/{{id}}"
    id_doc = f"the {rt.name}'s id ({rt.prefix}_…)"
    first_kind = rt.deletion.first_kind if isinstance(rt.deletion, Buffered) else rt.final_kind
    # the query parameters the hooks of dependent types read when a deletion starts (registry-declared)
    options = resources.DELETION_OPTIONS.get(rt.name, [])
    delete_query = create_model(f"{cap}DeleteQuery", __base__=tuple(options)) if options else None
    delete_answers: dict[int, Any] = {202: accepted, 401: None, 404: None, 409: None, **({422: None} if options else {})}
    ops = [
        Operation("POST", base, _create_handler(api, accepted), f"create{cap}", f"Create {_a(rt.name)}", rt.plural,
                  {202: accepted, 400: None, 401: None, 409: None, 422: None}, request=api.create_model,
                  idempotent=True,
                  example={rt.name: api.example, "job": {**job_ref, "kind": rt.kinds[0]}}),
        Operation("GET", base, _list_handler(api, page), f"list{plural_cap}", f"List {rt.plural}", rt.plural,
                  {200: page, 401: None, 422: None}, query=status_enum,
                  example={rt.plural.replace("-", "_"): [api.example], "next_after": None}),
        Operation("GET", item, _get_handler(api, one), f"get{cap}", f"Get {_a(rt.name)}", rt.plural,
                  {200: one, 401: None, 404: None}, path_id=id_doc, example={rt.name: api.example}),
    ]
    if isinstance(rt.deletion, Buffered):
        deleting = {**api.example, "status": "deleting", "delete_after": "2026-12-01T04:05:00Z"}
        ops.append(Operation("DELETE", item, _delete_handler(api, accepted), f"delete{cap}",
                             f"Delete {_a(rt.name)} (two-phase: a buffer during which it can be cancelled)", rt.plural,
                             delete_answers, path_id=id_doc, query=delete_query,
                             example={rt.name: deleting, "job": {**job_ref, "kind": first_kind}}))
        ops.append(Operation("POST", f"{item}/actions/cancel-deletion", _cancel_handler(api, accepted),
                             f"cancel{cap}Deletion", "Cancel a deletion within its buffer", rt.plural,
                             {202: accepted, 401: None, 404: None, 409: None, 422: None}, path_id=id_doc,
                             idempotent=True,
                             example={rt.name: api.example, "job": {**job_ref, "kind": rt.kinds[0]}}))
    else:
        ops.append(Operation("DELETE", item, _delete_handler(api, accepted), f"delete{cap}",
                             f"Delete {_a(rt.name)} (at once: its final job is enqueued)", rt.plural,
                             delete_answers, path_id=id_doc, query=delete_query,
                             example={rt.name: {**api.example, "status": "destroying"},
                                      "job": {**job_ref, "kind": first_kind}}))
    if api.actions is not None:
        ops += api.actions(api)
    return ops
