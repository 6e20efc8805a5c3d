"""API tokens: authentication, scopes, management (``/v1/tokens``), what tenants may see.

- **Authentication.** ``Authorization: Bearer <token>``; the token's row gives its tenant,
  scopes and expiry, remembered per API process for ``Z9_API_TOKEN_CACHE_S`` seconds (never past
  the token's expiry): a token revoked elsewhere keeps working at most that long; one revoked
  through this process stops at once. 401 answers carry ``WWW-Authenticate: Bearer``.
- **Scopes.** ``read``: GET only (a mutation answers 403 naming the scope); ``write``:
  mutations too; ``operator``: sees platform details (below). ``operator`` is granted only by
  ``z9 token --scope operator`` (database access), never through the API; a token can only
  make tokens with scopes it has itself.
- **Last use.** Each process notes the tokens used and writes ``last_used_at`` for all of them
  in one statement every ``Z9_API_TOKEN_LAST_USED_S`` seconds (60): it is that coarse, and
  costs no write per request.
- **Platform details.** Answers to a token without ``operator`` carry no Proxmox account: the
  user/token id inside UPIDs (``UPID:node:…:root@pam!z9:``) and the configured regions' token
  ids are replaced by ``hidden`` in the fields z9 writes from Proxmox (jobs' steps and errors,
  resources' status_reason: :mod:`z9.api.redaction`), never in a tenant's own fields.
- **Lineage.** A token made through the API records the token that made it (``created_by``,
  listed by ``GET /v1/tokens``). It never outlives that token: its expiry is at most its
  parent's (left out: the parent's; asked for longer: 422 naming ``expires_in_s``); revoking a
  token revokes every token it created, transitively; and a token whose parent (or any ancestor)
  is revoked or expired authenticates nothing.
- **Failed authentication** (an unknown, expired or revoked token) is limited per client address
  (``Z9_API_AUTH_FAILURES_PER_S``, ``Z9_API_AUTH_FAILURE_BURST``): once an address has spent
  its bucket, its requests answer 429 with ``Retry-After`` before any token is looked up in the
  database (a token this process knows from its cache still works).
- **Actor.** The token's id is put in :mod:`z9.common.requestctx`, so every job the request
  makes records it (``jobs.actor_token_id``; ``GET /v1/jobs?actor=tok_…|me``).
"""
from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import ipaddress
import logging
import re
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Awaitable, Callable

from aiohttp import web
from pydantic import BaseModel, Field, ValidationError

from z9.common import store
from z9.common.clock import SYSTEM, Clock
from z9.common.errors import BadRequest, Forbidden, NotFound, TooManyRequests, Unauthorized, ValidationFailed
from z9.common.ids import id_pattern, is_id
from z9.common.requestctx import ACTOR_TOKEN_ID

from . import plans
from . import resources as api
# the bodies the client shares (pydantic only), re-exported
from .bodies import Token, TokenCreate, TokenCreated  # noqa: F401
from .middleware import TokenBuckets

log = logging.getLogger("z9.api")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

SCOPES = ("read", "write", "operator")
READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
TOKEN_PREFIX = "z9t_"
WWW_AUTHENTICATE = 'Bearer realm="z9"'
_CACHE_MAX = 10_000


def new_secret(tag_key: bytes | None = None) -> str:
    """A new API token: ``z9t_`` and 256 random bits, then (with ``tag_key``) ``.`` and its tag
    (:func:`token_tag`): ``z9t_<43 chars>.<22 chars>``."""
    body = secrets.token_urlsafe(32)
    return TOKEN_PREFIX + body + ("." + token_tag(tag_key, body) if tag_key is not None else "")


# A token's tag: HMAC-SHA256 of its random part under a key derived from the installation key,
# 128 bits. It lets the API tell, without the database, a token z9 minted from a forged one: a
# client address that failed authentication too often is refused at once (429) — but a token
# whose tag verifies is still looked up, so nobody sharing the address (behind a NAT or an
# ingress) is locked out by another's bad tokens. Tokens minted before tags (no ``.``) stay valid
# and are limited with the address as before.
_TAGGED = re.compile(r"z9t_([A-Za-z0-9_-]{43})\.([A-Za-z0-9_-]{22})")


def token_tag_key(settings: Any) -> bytes | None:
    """The key of token tags, derived from ``Z9_INSTALLATION_KEY`` (None without one)."""
    from z9.common.pki import InstallationKey, SealError

    if getattr(settings, "installation_key", None) is None:
        return None
    try:
        raw = InstallationKey.parse(settings.installation_key.get_secret_value()).raw
    except SealError:  # refused where the key is used (clusters); tokens are minted untagged
        return None
    return hmac.new(raw, b"z9 api token tag v1", hashlib.sha256).digest()


def token_tag(tag_key: bytes, body: str) -> str:
    mac = hmac.new(tag_key, body.encode(), hashlib.sha256).digest()[:16]
    return base64.urlsafe_b64encode(mac).decode().rstrip("=")


def tag_verdict(tag_key: bytes | None, token: str) -> bool | None:
    """True: a tagged token whose tag verifies (one z9 minted); False: the tagged form with a
    wrong tag (forged); None: not the tagged form (an older token, or junk), or no key here."""
    m = _TAGGED.fullmatch(token)
    if m is None or tag_key is None:
        return None
    return hmac.compare_digest(token_tag(tag_key, m[1]), m[2])


def client_key(remote: str | None) -> str:
    """The failed-authentication bucket of a client address: the address itself for IPv4 (an
    IPv4-mapped IPv6 address as its IPv4), its /64 for IPv6 (one host commonly holds a whole /64)."""
    if not remote:
        return "unknown"
    try:
        ip = ipaddress.ip_address(remote.split("%", 1)[0])
    except ValueError:
        return remote
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


# ---------------------------------------------------------------------------------- models

class TokenList(BaseModel):
    """A page of tokens (``GET /v1/tokens``)."""

    tokens: list[Token]
    next_after: str | None = Field(description="pass as `after` for the next page; null on the last")


class TokenRevoked(BaseModel):
    """The answer to ``DELETE /v1/tokens/{id}``: the revoked token."""

    token: Token


class TokenListQuery(BaseModel):
    """Query parameters of ``GET /v1/tokens``."""

    after: str | None = Field(default=None, description="id of the last token of the previous page",
                              json_schema_extra={"pattern": id_pattern("tok")})
    limit: int = Field(default=100, ge=1, le=500)
    include_revoked: bool = Field(default=False, description="list revoked tokens too")


def _token_json(row: Any) -> dict[str, Any]:
    return Token.model_validate(dict(row)).model_dump(mode="json")


# ---------------------------------------------------------------------------------- principal

@dataclass(frozen=True)
class Principal:
    token_id: str
    tenant_id: str
    scopes: frozenset[str]
    expires_at: datetime | None = None  # the earliest expiry along the token's line (None: never)

    @property
    def operator(self) -> bool:
        return "operator" in self.scopes


PRINCIPAL = web.RequestKey("principal", Principal)
CACHE = web.AppKey("token_principals", dict)  # sha256 → (Principal, monotonic expiry)
TOUCHER = web.AppKey("token_toucher", object)
class FailureBuckets(TokenBuckets):
    """Failed authentications per client address (a bucket each; ``Z9_API_AUTH_FAILURE*``)."""

    def limited(self, key: str) -> tuple[bool, float]:
        """Whether ``key``'s bucket is empty now, spending nothing: ``(limited, level)``."""
        now = self.clock()
        level, at = self._buckets.get(key, (float(self.burst), now))
        level = min(float(self.burst), level + (now - at) * self.per_s)
        return level < 1.0, level


AUTH_FAILURES = web.AppKey("auth_failures", FailureBuckets)
TAG_KEY = web.AppKey("token_tag_key", object)  # bytes | None
# tagged tokens that verified but are unknown, expired or revoked (sha256): such a token never
# becomes valid again, so a limited address presenting one again is refused without a lookup
UNKNOWN_TAGGED = web.AppKey("unknown_tagged_tokens", set)


def _cached(app: web.Application, token: str) -> Principal | None:
    hit = app[CACHE].get(hashlib.sha256(token.encode()).digest())
    return hit[0] if app[api.SETTINGS].api_token_cache_s > 0 and hit is not None and hit[1] > api.clock_of(app).monotonic() \
        else None


class _Toucher:
    """Writes ``last_used_at`` of the tokens used, all at once, every ``period_s`` seconds."""

    def __init__(self, pool_of: Callable[[], Any], period_s: float, clock: Clock = SYSTEM):
        self.pool_of = pool_of
        self.period_s = period_s
        self.clock = clock
        self.used: set[str] = set()
        self.writes = 0  # statements sent (tests)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="z9-token-touch")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self.flush()

    async def _loop(self) -> None:
        while True:
            await self.clock.sleep(self.period_s)
            await self.flush()

    async def flush(self) -> None:
        if not self.used:
            return
        ids, self.used = sorted(self.used), set()
        try:
            await store.api_token_touch(self.pool_of(), ids, self.period_s / 2, now=self.clock.db_now())
            self.writes += 1
        except Exception as e:  # last use is informative: never fail requests for it
            log.warning("could not record the last use of %d token(s): %s", len(ids), e)


async def _principal(app: web.Application, token: str) -> Principal | None:
    return await principal_of_digest(app, hashlib.sha256(token.encode()).digest(), token)


async def principal_of_digest(app: web.Application, key: bytes, token: str | None = None) -> Principal | None:
    """The principal of the token whose SHA-256 is ``key`` (``token`` itself when known), cached
    like every token, or None."""
    ttl = app[api.SETTINGS].api_token_cache_s
    cache = app[CACHE]
    clock = api.clock_of(app)
    now = clock.monotonic()
    hit = cache.get(key)
    if ttl > 0 and hit is not None and hit[1] > now:
        return hit[0]
    row = (await store.api_token_auth(app[api.POOL], token, now=clock.db_now()) if token is not None
           else await store.api_token_auth_sha256(app[api.POOL], key, now=clock.db_now()))
    if row is None:
        cache.pop(key, None)
        return None
    p = Principal(row["id"], row["tenant_id"], frozenset(row["scopes"]), row["expires_at"])
    if ttl > 0:
        until = now + ttl
        if row["expires_at"] is not None:
            until = min(until, now + (row["expires_at"] - clock.now()).total_seconds())
        if len(cache) >= _CACHE_MAX:
            cache.clear()
        cache[key] = (p, until)
    return p


def unauthorized(message: str) -> Unauthorized:
    return Unauthorized(message, headers={"WWW-Authenticate": WWW_AUTHENTICATE})


def limit_failures(request: web.Request, token: str | None = None) -> None:
    """Raise 429 when the client's failed-authentication bucket is empty, before any lookup (a
    flood of bad tokens or session cookies costs no database work) — except for a token this
    process knows from its cache, or one z9 minted (its tag verifies) not already found dead."""
    failures = request.app[AUTH_FAILURES]
    if not failures.enabled or (token is not None and _cached(request.app, token) is not None):
        return
    client = client_key(request.remote)
    limited, level = failures.limited(client)
    if not limited:
        return
    if token is not None:
        # a forged tag (or one of an installation key since replaced) counts as no tag: limited
        # with the address, looked up otherwise — a token is never refused for its tag alone
        tagged = tag_verdict(request.app[TAG_KEY], token) is True  # type: ignore[arg-type]
        if tagged and hashlib.sha256(token.encode()).digest() not in request.app[UNKNOWN_TAGGED]:
            return
    wait = failures.retry_after(level)
    raise TooManyRequests(f"too many failed authentications from {client} ({failures.burst} at once, "
                          f"refilled at {failures.per_s:g}/s); retry in {wait}s",
                          headers={"Retry-After": str(wait)})


def authentication_failed(request: web.Request, token: str | None = None) -> None:
    """Count a failed authentication (a bad token, or a bad console session cookie) against the
    client's bucket."""
    failures = request.app[AUTH_FAILURES]
    if failures.enabled:
        failures.take(client_key(request.remote))
    if token is not None and tag_verdict(request.app[TAG_KEY], token) is True:  # type: ignore[arg-type]
        dead = request.app[UNKNOWN_TAGGED]
        if len(dead) >= _CACHE_MAX:
            dead.clear()
        dead.add(hashlib.sha256(token.encode()).digest())


async def authenticate(request: web.Request, token: str) -> Principal | None:
    """The principal of API token ``token`` through the failed-authentication limiter (429 before
    any lookup once the client's bucket is empty; a failure spends from it): None when unknown,
    expired or revoked. Bearer requests and the console's sign-in both come here."""
    if not (token.isascii() and len(token) <= 200):
        # no token z9 mints (undecodable bytes arrive as lone surrogates, which nothing may
        # encode): a failed authentication, with nothing of it looked at
        limit_failures(request)
        authentication_failed(request)
        return None
    limit_failures(request, token)
    principal = await _principal(request.app, token)
    if principal is None:
        authentication_failed(request, token)
    return principal


@web.middleware
async def auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Bearer token on every ``/v1`` route but the OpenAPI document; scope checks; the actor of
    the jobs the request makes; platform details hidden from tokens without ``operator``."""
    if not request.path.startswith("/v1/") or request.path == "/v1/openapi.json":
        return await handler(request)
    from . import console

    session_id = console.cookie_session(request)
    if session_id is not None:  # the web console's session (z9.api.console): CSRF-checked below
        if not console.session_cached(request.app, session_id):
            limit_failures(request)
        principal = await console.session_principal(request.app, session_id)
        if principal is None:
            authentication_failed(request)
            raise unauthorized("the console session is unknown, signed out or expired, or its token is no longer "
                               "valid: sign in again")
        if request.method not in READ_METHODS:
            console.check_csrf(request, session_id)
    else:
        header = request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise unauthorized("missing bearer token: send 'Authorization: Bearer <token>'")
        principal = await authenticate(request, token)
        if principal is None:
            raise unauthorized("unknown, expired or revoked API token")
    request[PRINCIPAL] = principal
    request[api.TENANT] = principal.tenant_id
    ACTOR_TOKEN_ID.set(principal.token_id)
    request.app[TOUCHER].used.add(principal.token_id)  # type: ignore[attr-defined]
    if request.method not in READ_METHODS and "write" not in principal.scopes and not plans.is_plan(request):
        raise Forbidden(f"this token has scopes {','.join(sorted(principal.scopes))}: "
                        f"{request.method} needs the write scope", code="insufficient_scope",
                        details=[{"scope": "write"}])
    response = await handler(request)
    if not principal.operator and isinstance(response, web.Response) and response.body is not None:
        body = response.body
        if isinstance(body, bytes) and (b"@" in body or b"UPID:" in body):
            redacted = redact(body, _platform_users(request.app))
            if redacted is not body:
                response.body = redacted
    return response


# ---------------------------------------------------------------------------------- redaction

# UPID:<node>:<pid>:<pstart>:<starttime>:<type>:<id>:<user>:  — the user (user@realm!tokenid)
_UPID_USER = re.compile(rb"(UPID:[^:\"\s]*:[0-9A-Fa-f]{8}:[0-9A-Fa-f]{8,9}:[0-9A-Fa-f]{8}:[^:\"\s]*:[^:\"\s]*:)"
                        rb"([^:\"\s]+)(:)")
PLATFORM_USERS = web.AppKey("platform_users", tuple)


def _platform_users(app: web.Application) -> tuple[bytes, ...]:
    """The configured regions' Proxmox token ids and their users, longest first."""
    return app[PLATFORM_USERS]


def platform_users(settings: Any) -> tuple[bytes, ...]:
    names: set[str] = set()
    for r in settings.regions.values():
        names.add(r.token_id)
        names.add(r.token_id.split("!", 1)[0])
    return tuple(sorted((n.encode() for n in names if n), key=len, reverse=True))


def redact(body: bytes, users: tuple[bytes, ...]) -> bytes:
    """``body`` with the platform's identity hidden where z9 writes it (:mod:`z9.api.redaction`):
    never a tenant's own fields."""
    from .redaction import redact as redact_platform_fields

    return redact_platform_fields(body, users)


# ---------------------------------------------------------------------------------- handlers

def _pydantic_error(e: ValidationError) -> Exception:
    return api.validation_error(e)


async def create_token(request: web.Request) -> web.Response:
    """``POST /v1/tokens`` → 201 ``{"token", "secret"}`` (the secret is shown once: only its
    hash is stored)."""
    if "Idempotency-Key" in request.headers:
        raise BadRequest("Idempotency-Key is not accepted on POST /v1/tokens: its answer holds a secret "
                         "that z9 never stores, so it cannot be replayed; list the tokens instead "
                         "(GET /v1/tokens) to see whether a lost request made one")
    body = await api.json_body(request)
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    try:
        spec = TokenCreate.model_validate(body)
    except ValidationError as e:
        raise _pydantic_error(e)
    me = request[PRINCIPAL]
    missing = sorted(set(spec.scopes) - me.scopes)
    if missing:
        raise Forbidden(f"scopes: this token cannot grant {','.join(missing)}, which it does not have",
                        code="insufficient_scope", details=[{"field": "scopes", "message": "not held"}])
    expires_at = (api.clock_of(request.app).now() + timedelta(seconds=spec.expires_in_s)
                  if spec.expires_in_s is not None else None)
    if me.expires_at is not None:  # never past the parent's expiry (lineage: see the module doc)
        if expires_at is None:
            expires_at = me.expires_at
        elif expires_at > me.expires_at:
            left = max(0, int((me.expires_at - api.clock_of(request.app).now()).total_seconds()))
            raise ValidationFailed(f"expires_in_s: {spec.expires_in_s} is past the expiry of the token making it "
                                   f"({me.expires_at.isoformat()}, {left}s from now); a token never outlives its "
                                   "parent", details=[{"field": "expires_in_s", "message": "past the parent's expiry",
                                                       "max": left}])
    secret = new_secret(request.app[TAG_KEY])  # type: ignore[arg-type]
    row = await store.api_token_create(request.app[api.POOL], me.tenant_id, secret, spec.name, scopes=spec.scopes,
                                       expires_at=expires_at, created_by=me.token_id)
    token = _token_json(row)
    return web.json_response({"token": token, "secret": secret}, status=201,
                             headers={"Location": f"/v1/tokens/{token['id']}", "Cache-Control": "no-store"})


async def list_tokens(request: web.Request) -> web.Response:
    """``GET /v1/tokens[?include_revoked=true&after=&limit=]``: the tenant's tokens with their
    last use (coarse: see the module docstring)."""
    after = request.query.get("after")
    if after is not None and not is_id(after, "tok"):
        raise ValidationFailed(f"after: {after!r} is not a token id",
                                   details=[{"field": "after", "message": "not a token id"}])
    raw = request.query.get("include_revoked", "false")
    if raw not in ("true", "false"):
        raise ValidationFailed("include_revoked: must be true or false",
                                   details=[{"field": "include_revoked", "message": "true or false"}])
    limit = api.limit_param(request)
    rows = await store.api_token_list(request.app[api.POOL], request[PRINCIPAL].tenant_id, after=after,
                                      include_revoked=raw == "true", limit=limit)
    return web.json_response({"tokens": [_token_json(r) for r in rows],
                              "next_after": rows[-1]["id"] if len(rows) == limit else None})


async def revoke_token(request: web.Request) -> web.Response:
    """``DELETE /v1/tokens/{id}`` → 200 with the revoked token (again on a repeat). It stops
    working at once on this API process, within the token cache time on the others."""
    tid = request.match_info["id"]
    me = request[PRINCIPAL]
    row, revoked = (await store.api_token_revoke_tree(request.app[api.POOL], tid, me.tenant_id)
                    if is_id(tid, "tok") else (None, []))
    if row is None:
        raise NotFound(f"no token {tid!r}")
    cache = request.app[CACHE]
    gone = set(revoked)  # the token and every token it created, transitively
    for key in [k for k, (p, _) in cache.items() if p.token_id in gone]:
        del cache[key]
    return web.json_response({"token": _token_json(row)})


def actor_filter(request: web.Request) -> str | None:
    """The ``actor`` query parameter of ``GET /v1/jobs``: a token id, or ``me`` (the calling
    token); None when absent."""
    raw = request.query.get("actor")
    if raw is None:
        return None
    if raw == "me":
        return request[PRINCIPAL].token_id
    if not is_id(raw, "tok"):
        raise ValidationFailed(f"actor: {raw!r} is not a token id (tok_…) or 'me'",
                               details=[{"field": "actor", "message": "not a token id"}])
    return raw


def install(app: web.Application) -> None:
    """Token state of ``app`` (cache, last-use writer) and the ``/v1/tokens`` routes."""
    app[CACHE] = {}
    settings = app[api.SETTINGS]
    app[AUTH_FAILURES] = FailureBuckets(settings.api_auth_failures_per_s, settings.api_auth_failure_burst)
    app[TAG_KEY] = token_tag_key(settings)
    app[UNKNOWN_TAGGED] = set()
    app[PLATFORM_USERS] = platform_users(app[api.SETTINGS])

    async def ctx(app: web.Application) -> Any:
        toucher = _Toucher(lambda: app[api.POOL], app[api.SETTINGS].api_token_last_used_s, api.clock_of(app))
        app[TOUCHER] = toucher
        toucher.start()
        yield
        await toucher.stop()

    app.cleanup_ctx.append(ctx)
