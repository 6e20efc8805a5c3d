"""The ``firewall`` type's API: the create hook (the row, its members and its FirewallCreate in one
transaction) and the type's own routes — ``PATCH``, ``actions/set-rules``, ``actions/apply-to-resources``,
``actions/remove-from-resources``. List, get and delete (immediate; refused while applied) are the generic
ones (:mod:`z9.api.resources`), the rows shown with their members (``ApiResource.enrich``).

Refusals, each naming the field or the precondition (Hetzner Cloud's codes where it has one):
422 ``rules`` (more than 50, more than 500 effective), ``rules[i].port`` (required for tcp/udp, forbidden
for icmp/esp/gre), ``rules[i].source_ips`` (more than 100, not a CIDR, on an ``out`` rule),
``applied_to[i].server_id`` (no such server), ``applied_to[i].label_selector`` (not a selector),
``rules[i].source_firewalls`` (no such firewall); 409 ``uniqueness_error`` (a name in use),
``firewall_already_applied`` (that server or selector is applied already), ``firewall_managed_by_label_selector``
(a server both directly and by a selector of the same firewall: refused, naming the entry that owns it —
never both, so never the ownership deadlock of hcloud #911), ``server_firewall_limit`` (5 a server),
``region_mismatch``, ``resource_deleting``, ``resource_in_use`` (delete while applied).
"""
from __future__ import annotations

from typing import Annotated, Any, Literal

from aiohttp import web
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictStr,
    field_validator,
    model_validator,
)
from z9.api import schemas
from z9.api.resources import (
    NOTIFIER,
    POOL,
    SETTINGS,
    ApiResource,
    CreateContext,
    Operation,
    dump,
    idempotency_begin,
    idempotency_end,
    idempotency_key,
    parse_body,
    path_id,
    request_hash,
    room_for_a_job,
    tenant,
)
from z9.common import labels as labels_
from z9.common import store
from z9.common.errors import (
    Conflict,
    NotFound,
    UniqueViolation,
    ValidationFailed,
    deleting,
)
from z9.common.ids import new_id
from z9.common.settings import Settings
from z9.resources import firewall as fwt
from z9.resources.firewall import FIREWALL, Firewall
from z9.resources.firewall import store as fw_store
from z9.resources.firewall.compile import (
    MAX_CIDRS,
    MAX_EFFECTIVE,
    MAX_PER_SERVER,
    MAX_RULES,
    WITH_PORTS,
    canonical_cidr,
    effective_count,
)
from z9.resources.server import store as server_store

from z9 import resources

SERVER_ID = r"^srv_[0-9a-z]{26}$"
FIREWALL_ID = r"^fw_[0-9a-z]{26}$"
PORT = r"^(any|[0-9]{1,5}(-[0-9]{1,5})?)$"
STATUSES = Literal["creating", "active", "deleting", "destroying", "deleted", "failed"]


class Rule(BaseModel):
    """One rule (Hetzner Cloud's shape): ``in`` rules name ``source_ips`` (CIDRs) and/or ``source_firewalls``
    (the members of those firewalls), ``out`` rules ``destination_ips``/``destination_firewalls``."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"direction": "in", "protocol": "tcp", "port": "22", "source_ips": ["0.0.0.0/0", "::/0"]}]})

    direction: Literal["in", "out"]
    protocol: Literal["tcp", "udp", "icmp", "esp", "gre"]
    port: StrictStr | None = Field(None, pattern=PORT, description='"80", "80-85" or "any"; tcp and udp only')
    source_ips: list[StrictStr] = Field(default_factory=list, max_length=MAX_CIDRS)
    destination_ips: list[StrictStr] = Field(default_factory=list, max_length=MAX_CIDRS)
    source_firewalls: list[Annotated[StrictStr, Field(pattern=FIREWALL_ID)]] = Field(
        default_factory=list, max_length=5, description="the members of these firewalls (ids)")
    destination_firewalls: list[Annotated[StrictStr, Field(pattern=FIREWALL_ID)]] = Field(
        default_factory=list, max_length=5)
    description: StrictStr | None = Field(None, max_length=255)

    @field_validator("source_ips", "destination_ips")
    @classmethod
    def _cidrs(cls, v: list[str]) -> list[str]:
        out = []
        for c in v:
            try:
                out.append(canonical_cidr(c))
            except ValueError:
                raise ValueError(f"{c!r} is not an IP address or CIDR") from None
        return list(dict.fromkeys(out))

    @field_validator("source_firewalls", "destination_firewalls")
    @classmethod
    def _fw_ids(cls, v: list[str]) -> list[str]:
        return list(dict.fromkeys(v))

    @model_validator(mode="after")
    def _shape(self) -> Rule:
        if self.protocol in WITH_PORTS and self.port is None:
            raise ValueError(f"port: required for protocol {self.protocol}")
        if self.protocol not in WITH_PORTS and self.port is not None:
            raise ValueError(f"port: not allowed for protocol {self.protocol}")
        if self.port and self.port != "any":
            lo, _, hi = self.port.partition("-")
            if not 1 <= int(lo) <= 65535 or (hi and not int(lo) < int(hi) <= 65535):
                raise ValueError(f"port: {self.port!r} is not a port 1-65535 or a range a-b with a < b")
        if self.direction == "in":
            if self.destination_ips or self.destination_firewalls:
                raise ValueError("destination_ips/destination_firewalls: not allowed on an in rule (use source_ips)")
            if not self.source_ips and not self.source_firewalls:
                raise ValueError("source_ips: an in rule needs source_ips or source_firewalls")
        else:
            if self.source_ips or self.source_firewalls:
                raise ValueError("source_ips/source_firewalls: not allowed on an out rule (use destination_ips)")
            if not self.destination_ips and not self.destination_firewalls:
                raise ValueError("destination_ips: an out rule needs destination_ips or destination_firewalls")
        return self

    def stored(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True)


class AppliedToServer(BaseModel):
    """A server, by id."""

    model_config = ConfigDict(extra="forbid", title="AppliedToServer",
                              json_schema_extra={"examples": [{"server_id": "srv_01jd3x5v8q2m6n4p7r9s1t3w5y"}]})

    type: Literal["server"] = Field("server", description="Hetzner's discriminator (optional here)")
    server_id: StrictStr = Field(pattern=SERVER_ID)

    @property
    def label_selector(self) -> str | None:
        return None

    def stored(self) -> dict[str, Any]:
        return {"server_id": self.server_id}


class AppliedToSelector(BaseModel):
    """Every server of the firewall's region whose labels match, now and later."""

    model_config = ConfigDict(extra="forbid", title="AppliedToSelector",
                              json_schema_extra={"examples": [{"label_selector": "role=web"}]})

    type: Literal["label_selector"] = Field("label_selector", description="Hetzner's discriminator (optional here)")
    label_selector: StrictStr = Field(min_length=1, max_length=1024, pattern=labels_.SELECTOR_PATTERN,
                                      description="comma-separated requirements `k=v`, `k!=v`, `k`, `!k`, `k in (a,b)`")

    @property
    def server_id(self) -> str | None:
        return None

    @field_validator("label_selector")
    @classmethod
    def _parses(cls, v: str) -> str:
        labels_.parse(v)  # (the pattern admits only what parses; a ValueError here names the field)
        return v

    def stored(self) -> dict[str, Any]:
        return {"label_selector": self.label_selector}


AppliedTo = AppliedToServer | AppliedToSelector


class FirewallCreate(BaseModel):
    """``POST /v1/firewalls``."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"name": "web", "region": "dev-1", "rules": [
            {"direction": "in", "protocol": "tcp", "port": "22", "source_ips": ["0.0.0.0/0", "::/0"]},
            {"direction": "in", "protocol": "tcp", "port": "443", "source_ips": ["0.0.0.0/0", "::/0"]}]},
        {"name": "web-servers", "region": "dev-1", "rules": [
            {"direction": "in", "protocol": "tcp", "port": "443", "source_ips": ["0.0.0.0/0", "::/0"]}],
         "applied_to": [{"label_selector": "role=web"}]}]})

    name: StrictStr = Field(pattern=schemas.NAME_PATTERN, description="DNS label, lower case, 1-63 chars")
    region: StrictStr = Field(min_length=1, max_length=63)
    labels: schemas.Labels | None = None
    rules: list[Rule] = Field(default_factory=list, max_length=MAX_RULES, description=f"at most {MAX_RULES}")
    applied_to: list[AppliedTo] = Field(default_factory=list, max_length=100)


class FirewallPatch(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"minProperties": 1, "examples": [{"name": "web-2"}]})

    name: StrictStr | None = Field(None, pattern=schemas.NAME_PATTERN)
    labels: schemas.Labels | None = None

    @model_validator(mode="after")
    def _something(self) -> FirewallPatch:
        if not self.model_fields_set:
            raise ValueError("give at least one of name, labels")
        return self


class SetRules(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"rules": [{"direction": "in", "protocol": "tcp", "port": "443", "source_ips": ["0.0.0.0/0", "::/0"]}]},
        {"rules": []}]})

    rules: list[Rule] = Field(max_length=MAX_RULES, description=f"replaces every rule (at most {MAX_RULES}); [] removes all")


class ApplyTo(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"apply_to": [{"server_id": "srv_01jd3x5v8q2m6n4p7r9s1t3w5y"}]}]})

    apply_to: list[AppliedTo] = Field(min_length=1, max_length=100)


class RemoveFrom(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"remove_from": [{"server_id": "srv_01jd3x5v8q2m6n4p7r9s1t3w5y"}]}]})

    remove_from: list[AppliedTo] = Field(min_length=1, max_length=100)


class AppliedToOut(schemas.Response):
    type: Literal["server", "label_selector"]
    server_id: str | None
    label_selector: str | None
    applied_to_resources: list[str] | None = Field(description="the servers the selector applies to now")


class FirewallMemberOut(schemas.Response):
    """A server the firewall applies to and where its rules stand there (DigitalOcean's pending_changes)."""

    server_id: str
    via: Literal["server", "label_selector"]
    status: Literal["pending", "applied", "removing"] = Field(
        description="applied: its rules seen on the server's VM one pve-firewall cycle after they were written, "
                    "and a check of them answered as the rules say")
    enforced: bool | None = Field(description="false: the datacenter firewall (or the VM's) is off: nothing is "
                                              "filtered whatever the rules say")
    detail: str | None
    applied_at: schemas.OptTimestamp


class RuleOut(schemas.Response):
    direction: Literal["in", "out"]
    protocol: Literal["tcp", "udp", "icmp", "esp", "gre"]
    port: str | None
    source_ips: list[str]
    destination_ips: list[str]
    source_firewalls: list[str]
    destination_firewalls: list[str]
    description: str | None


class FirewallOut(schemas.Response):
    """A firewall (``GET /v1/firewalls/{id}``)."""

    id: str = Field(pattern=r"^fw_[0-9a-z]{26}$")
    name: str
    region: str
    labels: dict[str, str]
    rules: list[RuleOut]
    applied_to: list[AppliedToOut]
    members: list[FirewallMemberOut]
    status: STATUSES
    status_reason: str | None
    created_at: schemas.Timestamp
    updated_at: schemas.Timestamp
    deleted_at: schemas.OptTimestamp


EXAMPLE: dict[str, Any] = {
    "id": "fw_01jd3x5v8q2m6n4p7r9s1t3w5y", "name": "web", "region": "dev-1", "labels": {},
    "rules": [{"direction": "in", "protocol": "tcp", "port": "22", "source_ips": ["0.0.0.0/0", "::/0"],
               "destination_ips": [], "source_firewalls": [], "destination_firewalls": [], "description": None}],
    "applied_to": [{"type": "server", "server_id": "srv_01jd3x5v8q2m6n4p7r9s1t3w5y", "label_selector": None,
                    "applied_to_resources": None}],
    "members": [{"server_id": "srv_01jd3x5v8q2m6n4p7r9s1t3w5y", "via": "server", "status": "pending",
                 "enforced": None, "detail": None, "applied_at": None}],
    "status": "creating", "status_reason": None, "created_at": "2026-12-01T04:00:00Z",
    "updated_at": "2026-12-01T04:00:00Z", "deleted_at": None,
}


# ---------------------------------------------------------------------------------- checks

def _field_error(field: str, message: str) -> ValidationFailed:
    return ValidationFailed(f"{field}: {message}", details=[{"field": field, "message": message}])


def _check_rules(firewall_id: str, rules: list[Rule]) -> list[dict[str, Any]]:
    if len(rules) > MAX_RULES:
        raise _field_error("rules", f"{len(rules)} rules; a firewall holds at most {MAX_RULES}")
    stored = [r.stored() for r in rules]
    n = effective_count(firewall_id, stored)
    if n > MAX_EFFECTIVE:
        raise _field_error("rules", f"the rules compile to {n} effective rules; at most {MAX_EFFECTIVE}")
    return stored


async def _check_referenced(conn: Any, tenant_id: str, region: str, firewall_id: str, rules: list[Rule]) -> None:
    """A rule naming "members of firewall X": X is a firewall of the tenant and region (itself included),
    share-locked until the request's transaction ends — a ``DELETE`` of X racing this request either waits
    and then sees the rule naming X (409 ``resource_in_use``), or commits first and X is refused here (its
    status ``deleting``): never a rule naming a deleted firewall."""
    for i, r in enumerate(rules):
        for key in ("source_firewalls", "destination_firewalls"):
            for other in getattr(r, key):
                if other == firewall_id:
                    continue
                row = await fw_store.get_for_share(conn, other, tenant_id)
                if row is None or row.status in ("deleting", "destroying", "deleted"):
                    raise ValidationFailed(f"rules.{i}.{key}: no firewall {other!r}",
                                           details=[{"field": f"rules.{i}.{key}", "message": "unknown firewall"}])
                if row.region != region:
                    raise Conflict(f"firewall {other} is in region {row.region}, this one in {region}",
                                   code="region_mismatch", details={"kind": "firewall", "id": other})


async def _server(conn: Any, tenant_id: str, server_id: str, region: str, field: str) -> Any:
    """A server to apply a firewall to, locked (FOR UPDATE) until the request's transaction ends."""
    s = await server_store.server_get_for_update(conn, server_id, tenant_id)
    if s is None:
        raise ValidationFailed(f"{field}: no server {server_id!r}", details=[{"field": field, "message": "unknown server"}])
    if s.region != region:
        raise Conflict(f"server {s.id} is in region {s.region}, the firewall in {region}: a firewall applies only "
                       "to servers of its region", code="region_mismatch",
                       details={"kind": "server", "id": s.id, "region": s.region})
    if s.status in ("deleting", "destroying", "deleted"):
        raise Conflict(f"server {s.id} is {s.status}; a firewall cannot be applied to it",
                       **deleting("server", s.id, s.status))
    return s


async def _room_on(conn: Any, server_id: str, firewall_id: str) -> None:
    if await fw_store.count_of_server(conn, server_id, firewall_id) >= MAX_PER_SERVER:
        raise Conflict(f"server {server_id} has {MAX_PER_SERVER} firewalls, the most a server takes; remove one first",
                       code="server_firewall_limit",
                       details={"kind": "server", "id": server_id, "limit": MAX_PER_SERVER})


async def _apply(conn: Any, fw: Firewall, entries: list[AppliedTo], *, field: str) -> tuple[list[dict[str, Any]], list[str]]:
    """Add ``entries`` to ``fw``'s applied_to: the new list and the servers that become members. Refuses a
    second path to one server (409 ``firewall_managed_by_label_selector`` naming the owning entry) and an
    entry applied already (409 ``firewall_already_applied``)."""
    applied = [dict(a) for a in fw.applied_to]
    current = {m.server_id: m for m in (fw.members or ()) if m.state != "removing"}
    new_members: dict[str, str] = {}
    for i, e in enumerate(entries):
        f = f"{field}.{i}"
        if e.server_id is not None:
            if any(a.get("server_id") == e.server_id for a in applied):
                raise Conflict(f"firewall {fw.id} is already applied to server {e.server_id}",
                               code="firewall_already_applied", details={"kind": "server", "id": e.server_id})
            owner = current.get(e.server_id)
            if owner is not None and owner.via == "label_selector" or new_members.get(e.server_id) == "label_selector":
                sel = next((a["label_selector"] for a in applied if a.get("label_selector") is not None
                            and e.server_id in current), None)
                raise Conflict(f"server {e.server_id} is a member of firewall {fw.id} through its label selector "
                               f"{sel!r}; it cannot be applied directly as well (one owner per membership: "
                               "remove the selector, or change the server's labels)",
                               code="firewall_managed_by_label_selector",
                               details={"kind": "label_selector", "label_selector": sel, "server_id": e.server_id})
            await _server(conn, fw.tenant_id, e.server_id, fw.region, f"{f}.server_id")
            applied.append(e.stored())
            new_members[e.server_id] = "server"
        else:
            assert e.label_selector is not None
            if any(a.get("label_selector") == e.label_selector for a in applied):
                raise Conflict(f"firewall {fw.id} is already applied to label selector {e.label_selector!r}",
                               code="firewall_already_applied",
                               details={"kind": "label_selector", "label_selector": e.label_selector})
            for sid in await fw_store.servers_matching(conn, fw.tenant_id, fw.region, labels_.parse(e.label_selector)):
                owner = current.get(sid)
                if owner is not None and owner.via == "server" or new_members.get(sid) == "server":
                    raise Conflict(f"label selector {e.label_selector!r} matches server {sid}, to which firewall "
                                   f"{fw.id} is applied directly; a server has one path to a firewall (remove the "
                                   "direct application first)", code="firewall_managed_by_label_selector",
                                   details={"kind": "server", "id": sid, "label_selector": e.label_selector})
                if owner is None:
                    new_members.setdefault(sid, "label_selector")
            applied.append(e.stored())
    for sid, via in new_members.items():
        await _room_on(conn, sid, fw.id)
        await fw_store.member_upsert(conn, fw.id, sid, via)
    return applied, list(new_members)


# ---------------------------------------------------------------------------------- create

def _unique(e: UniqueViolation, name: str | None) -> Conflict:
    if e.constraint == "firewalls_tenant_name_live":
        return Conflict(f"a firewall named {name!r} already exists in this tenant", code="uniqueness_error")
    raise e


def _job(row: Firewall, kind: str, servers: list[str], settings: Settings) -> Any:
    """A job of the firewall holding every server it touches as a lock key (ordered with their own jobs)."""
    return FIREWALL.new_job(row, kind, args={"servers": servers}, max_attempts=settings.max_attempts,
                            extra_lock_keys=tuple(servers))


def _touched(fw: Firewall) -> list[str]:
    return sorted(m.server_id for m in (fw.members or ()))


async def create(ctx: CreateContext, spec: FirewallCreate) -> tuple[Firewall, dict[str, Any]]:
    fid = new_id("fw")
    rules = _check_rules(fid, spec.rules)
    await _check_referenced(ctx.conn, ctx.tenant_id, spec.region, fid, spec.rules)
    try:
        row = await fw_store.insert(ctx.conn, id=fid, tenant_id=ctx.tenant_id, region=spec.region, name=spec.name,
                                    rules=rules, applied_to=[], labels=dict(spec.labels or {}))
    except UniqueViolation as e:
        raise _unique(e, spec.name)
    row = (await fw_store.with_members(ctx.conn, [row]))[0]
    applied, _ = await _apply(ctx.conn, row, spec.applied_to, field="applied_to")
    if applied:
        changed = await fw_store.set_rows(ctx.conn, row.id, applied_to=applied)
        assert changed is not None
        row = (await fw_store.with_members(ctx.conn, [changed]))[0]
    job = await store.job_insert(ctx.conn, _job(row, fwt.FIREWALL_CREATE, _touched(row), ctx.settings), notify=False)
    return row, job.brief()


# ---------------------------------------------------------------------------------- actions

def _operations(api: ApiResource) -> list[Operation]:
    accepted, one = api.models["accepted"], api.models["one"]
    id_doc = "the firewall's id (fw_…)"
    job_ref = {"id": "job_01jd3x5v8q2m6n4p7r9s1t3w5y", "status": "pending"}

    async def _locked(conn: Any, request: web.Request) -> Firewall:
        rid = path_id(request, "fw", "firewall")
        row = await fw_store.get_for_update(conn, rid, tenant(request))
        if row is None:
            raise NotFound(f"no firewall {rid!r}")
        if row.status in ("deleting", "destroying", "deleted"):
            raise Conflict(f"firewall {row.id} is {row.status}", **deleting("firewall", row.id, row.status))
        return (await fw_store.with_members(conn, [row]))[0]

    async def _servers_first(conn: Any, request: web.Request, entries: list[AppliedTo], current: bool) -> None:
        """Lock the servers an action on the firewall will lock, before the firewall: one lock order, a
        server then its firewalls, as a server's label change (``PATCH /servers/{id}``) and its deletion
        take them — never a deadlock between the two (the firewall's region read unlocked: it never
        changes)."""
        fw = await fw_store.get(conn, path_id(request, "fw", "firewall"), tenant(request))
        if fw is None:
            return  # (404 from _locked)
        selectors = [e.label_selector for e in entries if e.label_selector is not None]
        if current:  # (a removal matches the selectors the firewall keeps)
            selectors += [a["label_selector"] for a in fw.applied_to if a.get("label_selector") is not None]
        for sel in dict.fromkeys(selectors):
            await fw_store.servers_matching(conn, fw.tenant_id, fw.region, labels_.parse(sel))
        for sid in sorted({e.server_id for e in entries if e.server_id is not None}):
            await server_store.server_get_for_update(conn, sid, fw.tenant_id)

    async def _action(request: web.Request, route: str, body: Any, fn: Any,
                      lock_first: list[AppliedTo] | None = None, current: bool = False) -> web.Response:
        settings, pool, tenant_id = request.app[SETTINGS], request.app[POOL], tenant(request)
        key = idempotency_key(request)
        req_hash = request_hash(route, [request.match_info["id"], body])
        async with pool.acquire() as conn, conn.transaction():
            replay = await idempotency_begin(conn, tenant_id, key, req_hash)
            if replay is not None:
                return replay
            if lock_first is not None:
                await _servers_first(conn, request, lock_first, current)
            row0 = await _locked(conn, request)
            kind = await fn(conn, settings, row0)
            now = await fw_store.get(conn, row0.id)
            assert now is not None
            row = (await fw_store.with_members(conn, [now]))[0]
            await room_for_a_job(conn, settings, "firewall", row.id)
            job = await store.job_insert(conn, _job(row, kind, _touched(row), settings), notify=False)
            answer = dump(accepted, {"firewall": row.public(), "job": job.brief()})
            await idempotency_end(conn, tenant_id, key, req_hash, 202, answer)
        request.app[NOTIFIER].notify(job.region)
        return web.json_response(answer, status=202)

    async def set_rules(request: web.Request) -> web.Response:
        spec = await parse_body(request, SetRules)

        async def fn(conn: Any, settings: Settings, fw: Firewall) -> str:
            rules = _check_rules(fw.id, spec.rules)
            await _check_referenced(conn, fw.tenant_id, fw.region, fw.id, spec.rules)
            await fw_store.set_rows(conn, fw.id, rules=rules)
            await fw_store.members_pending(conn, fw.id)
            return fwt.FIREWALL_SET_RULES

        return await _action(request, "POST /firewalls/{id}/actions/set-rules", spec.model_dump(), fn)

    async def apply_to(request: web.Request) -> web.Response:
        spec = await parse_body(request, ApplyTo)

        async def fn(conn: Any, settings: Settings, fw: Firewall) -> str:
            applied, _ = await _apply(conn, fw, spec.apply_to, field="apply_to")
            await fw_store.set_rows(conn, fw.id, applied_to=applied)
            return fwt.FIREWALL_APPLY

        return await _action(request, "POST /firewalls/{id}/actions/apply-to-resources", spec.model_dump(), fn,
                             lock_first=list(spec.apply_to))

    async def remove_from(request: web.Request) -> web.Response:
        spec = await parse_body(request, RemoveFrom)

        async def fn(conn: Any, settings: Settings, fw: Firewall) -> str:
            applied = [dict(a) for a in fw.applied_to]
            members = {m.server_id: m for m in (fw.members or ()) if m.state != "removing"}
            for i, e in enumerate(spec.remove_from):
                entry = e.stored()
                if entry not in applied:
                    m = members.get(e.server_id or "")
                    if m is not None and m.via == "label_selector":
                        sel = next((a["label_selector"] for a in applied if a.get("label_selector")), None)
                        raise Conflict(f"server {e.server_id} is a member of firewall {fw.id} through its label "
                                       f"selector {sel!r}, not directly; remove the selector or change the server's "
                                       "labels", code="firewall_managed_by_label_selector",
                                       details={"kind": "label_selector", "label_selector": sel,
                                                "server_id": e.server_id})
                    raise Conflict(f"firewall {fw.id} is not applied to {e.server_id or e.label_selector!r}",
                                   code="firewall_not_applied", details={"entry": i, **entry})
                applied.remove(entry)
                if e.server_id is not None:
                    await fw_store.member_removing(conn, fw.id, e.server_id)
            # a selector's members leave unless another selector still holding the firewall matches them
            keep = {sid for a in applied if a.get("label_selector") is not None
                    for sid in await fw_store.servers_matching(conn, fw.tenant_id, fw.region,
                                                               labels_.parse(a["label_selector"]))}
            for sid, m in members.items():
                if m.via == "label_selector" and sid not in keep:
                    await fw_store.member_removing(conn, fw.id, sid)
            await fw_store.set_rows(conn, fw.id, applied_to=applied)
            return fwt.FIREWALL_REMOVE

        return await _action(request, "POST /firewalls/{id}/actions/remove-from-resources", spec.model_dump(), fn,
                             lock_first=list(spec.remove_from), current=True)

    async def patch(request: web.Request) -> web.Response:
        spec = await parse_body(request, FirewallPatch)
        pool, tenant_id = request.app[POOL], tenant(request)
        rid = path_id(request, "fw", "firewall")
        try:
            row = await fw_store.patch(pool, rid, tenant_id, name=spec.name,
                                       labels=dict(spec.labels) if spec.labels is not None else None)
        except UniqueViolation as e:
            raise _unique(e, spec.name)
        if row is None:
            raise NotFound(f"no firewall {rid!r}")
        row = (await fw_store.with_members(pool, [row]))[0]
        return web.json_response(dump(one, {"firewall": row.public()}))

    ex = {"firewall": EXAMPLE, "job": {**job_ref, "kind": fwt.FIREWALL_SET_RULES}}
    errors = {202: accepted, 400: None, 401: None, 404: None, 409: None, 422: None}
    ops = [Operation("PATCH", "/firewalls/{id}", patch, "updateFirewall", "Rename a firewall or set its labels (no job)",
                     "firewalls", {200: one, 400: None, 401: None, 404: None, 409: None, 422: None},
                     request=FirewallPatch, path_id=id_doc, example={"firewall": EXAMPLE})]
    for name, handler, body, kind, summary in (
            ("set_rules", set_rules, SetRules, fwt.FIREWALL_SET_RULES,
             "Replace every rule of a firewall ([] removes all: inbound then closed but for the platform's own rules)"),
            ("apply_to_resources", apply_to, ApplyTo, fwt.FIREWALL_APPLY,
             "Apply a firewall to servers, by id or label selector"),
            ("remove_from_resources", remove_from, RemoveFrom, fwt.FIREWALL_REMOVE,
             "Take a firewall off servers or label selectors")):
        op_id = "".join(p.capitalize() for p in name.split("_"))
        path = f"/firewalls/{{id}}/actions/{name.replace('_', '-')}"  # kebab-case, as every action path
        example = {**ex, "job": {**job_ref, "kind": kind}}
        ops.append(Operation("POST", path, handler, f"{op_id[0].lower()}{op_id[1:]}Firewall", summary, "firewalls",
                             errors, request=body, path_id=id_doc, idempotent=True, example=example))
        # Hetzner Cloud's spelling of the same action (snake_case): an alias, marked deprecated in the document
        ops.append(Operation("POST", f"/firewalls/{{id}}/actions/{name}", handler,
                             f"{op_id[0].lower()}{op_id[1:]}FirewallSnakeCase", f"{summary} (Hetzner's path)",
                             "firewalls", errors, request=body, path_id=id_doc, idempotent=True, example=example,
                             deprecated=True,
                             description=f"Hetzner Cloud's spelling of `POST {path}` (the same operation), kept as "
                                         "an alias: z9's action paths are kebab-case."))
    return ops


class FirewallFilters(BaseModel):
    """``GET /v1/firewalls`` filters."""

    model_config = ConfigDict(extra="forbid")

    region: StrictStr | None = Field(None, min_length=1, max_length=63, description="only firewalls of this region")


async def list_rows(db: Any, tenant_id: str, filters: FirewallFilters, *, after: str | None, status: str | None,
                    limit: int, name: str | None = None, selector: Any = None,
                    include_deleted: bool = True) -> list[Firewall]:
    return await fw_store.list_rows(db, tenant_id, after=after, status=status, limit=limit, name=name,
                                    selector=selector, include_deleted=include_deleted, region=filters.region)


async def enrich(db: Any, rows: list[Firewall]) -> list[Firewall]:
    return await fw_store.with_members(db, rows)


# ---------------------------------------------------------------------------------- delete

async def deleting_hook(conn: Any, row: Firewall, options: Any, settings: Any) -> list[Any]:
    """``DELETE /v1/firewalls/{id}``: refused while the firewall applies to anything (409
    ``resource_in_use``, naming what), as Hetzner's ("Firewall still applied to a resource")."""
    fw = (await fw_store.with_members(conn, [row]))[0]
    live = [m.server_id for m in (fw.members or ())]
    if fw.applied_to or live:
        what = [f"label selector {a['label_selector']!r}" if a.get("label_selector") is not None
                else f"server {a.get('server_id')}" for a in fw.applied_to]
        what += [f"server {sid}" for sid in live if f"server {sid}" not in what]
        raise Conflict(f"firewall {fw.id} is still applied to {', '.join(what)}; remove it "
                       "from its resources first (actions/remove-from-resources)", code="resource_in_use",
                       details={"applied_to": fw.public()["applied_to"], "servers": live})
    naming = [f for f in await fw_store.referenced_by(conn, fw.id) if f != fw.id]
    if naming:
        raise Conflict(f"firewall {fw.id} is named by the rules of {', '.join(naming)} (\"members of\"); change "
                       "their rules first", code="resource_in_use", details={"firewalls": naming})
    return []


resources.on_deletion("firewall", deleting_hook)


API = ApiResource(rtype=FIREWALL, create_model=FirewallCreate, public_model=FirewallOut, create=create,
                  example=EXAMPLE, transactional=True, actions=_operations, list_filters=FirewallFilters,
                  list_rows=list_rows, enrich=enrich,
                  tag_description="Firewalls: rule sets (Hetzner Cloud's) applied to servers by id or label selector, "
                                  "compiled into each server's own Proxmox VM firewall.")
