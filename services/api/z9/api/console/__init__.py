"""The web console: a single page served by the API process under ``/console``, calling the same
``/v1`` API (same scopes, quotas, rate limits) from the browser.

- **Signing in.** ``POST /console/session {"token"}`` checks the API token (through the
  failed-authentication limiter of Bearer requests: 429 once the client address has spent its
  bucket, each bad token spending from it) and makes a **server-side session**: a random id
  (``z9s_…``, 256 bits) of which only the SHA-256 is stored (``console_sessions``), with the token
  it authenticates as. The cookie holds the session id, never the token: ``HttpOnly``,
  ``SameSite=Strict``, ``Path=/``; over HTTPS (or through a proxy saying ``X-Forwarded-Proto:
  https``) it is ``__Host-z9_console`` and ``Secure`` (no ``Domain``: a sibling host cannot set
  it), on plain http ``z9_console``. Every sign-in makes a new session (and ends the one the
  browser came with): a session id planted before sign-in is never the signed-in one.
- **Every cookie request** finds its session (remembered per API process like tokens, at most
  ``Z9_API_TOKEN_CACHE_S`` seconds and never past the session's expiry) and then passes the same
  checks as its token: a revoked or expired token (or line) ends its sessions. A session ends
  ``Z9_CONSOLE_SESSION_IDLE_S`` after its last use, ``Z9_CONSOLE_SESSION_MAX_S`` after sign-in,
  and at ``DELETE /console/session`` (sign-out revokes its row: a copy of the cookie stops
  working at once on this process, within the cache time on the others). A bad session cookie
  counts as a failed authentication. ``GET /console/session`` tells the page who it is (tenant,
  scopes) and its CSRF token (``{"signed_in": false}`` without a live session).
- **CSRF.** A ``/v1`` request authenticated by the cookie (no ``Authorization`` header) that is
  not a GET must carry ``X-CSRF-Token``: an HMAC of the session id, so it differs per session,
  dies with it, and only a page that asked ``GET /console/session`` (same origin: SameSite=Strict
  and no CORS) knows it; without it, or with another one, 403 ``csrf_failed``. An ``Origin``
  header naming another origin is refused too. Bearer-token clients are unaffected.
- **No inline script.** Every page carries a Content-Security-Policy allowing scripts and styles
  from the console's own files only (``script-src 'self'``: no ``unsafe-inline``, no ``eval``).
- **Offline.** The page is plain ES modules and CSS in ``static/`` (no build step, nothing
  fetched from elsewhere); it derives the resource kinds, their forms and their actions from
  ``/v1/openapi.json``.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import re
import secrets
from pathlib import Path
from typing import Any

from aiohttp import web

from z9.common import store
from z9.common.errors import BadRequest, Forbidden

STATIC = Path(__file__).with_name("static")
COOKIE = "z9_console"  # plain http (z9 dev)
SECURE_COOKIE = "__Host-z9_console"  # over HTTPS: Secure, Path=/, no Domain
SESSION_PREFIX = "z9s_"
CSRF_HEADER = "X-CSRF-Token"
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "font-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
_TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8",
          ".html": "text/html; charset=utf-8", ".svg": "image/svg+xml"}
_SESSION_ID = re.compile(r"z9s_[A-Za-z0-9_-]{43}")
# sha256(session id) -> (sha256 of its token, monotonic time until which this is trusted)
SESSIONS = web.AppKey("console_sessions", dict)


def new_session_id() -> str:
    return SESSION_PREFIX + secrets.token_urlsafe(32)


def csrf_token(session_id: str) -> str:
    """The CSRF token of a console session: HMAC-SHA256 of a fixed text under the session id
    (stateless, the same on every API replica, unknowable without the session id, different in
    every session)."""
    return hmac.new(session_id.encode(), b"z9 console csrf v2", hashlib.sha256).hexdigest()


def cookie_name(request: web.Request) -> str:
    return SECURE_COOKIE if _scheme(request) == "https" else COOKIE


def cookie_session(request: web.Request) -> str | None:
    """The session id of the console cookie, when the request carries one and no Authorization."""
    if "Authorization" in request.headers:
        return None
    value = request.cookies.get(cookie_name(request))
    return value.strip() if value and value.strip() else None


def _digest(session_id: str) -> bytes:
    return hashlib.sha256(session_id.encode()).digest()


def session_cached(app: web.Application, session_id: str) -> bool:
    """Whether this process knows ``session_id`` as live (and its token as valid) right now."""
    from .. import resources as api
    from .. import tokens

    if not _SESSION_ID.fullmatch(session_id):  # never one of ours (nor anything encodable, maybe)
        return False
    hit = app[SESSIONS].get(_digest(session_id))
    if hit is None or app[api.SETTINGS].api_token_cache_s <= 0 or hit[1] <= api.clock_of(app).monotonic():
        return False
    token_hit = app[tokens.CACHE].get(hit[0])
    return token_hit is not None and token_hit[1] > api.clock_of(app).monotonic()


async def session_principal(app: web.Application, session_id: str) -> Any:
    """The principal of a live session (then the same checks as its token), or None."""
    from .. import resources as api
    from .. import tokens

    if not _SESSION_ID.fullmatch(session_id):
        return None
    settings = app[api.SETTINGS]
    ttl = settings.api_token_cache_s
    key = _digest(session_id)
    cache = app[SESSIONS]
    clock = api.clock_of(app)
    now = clock.monotonic()
    hit = cache.get(key)
    if ttl > 0 and hit is not None and hit[1] > now:
        token_sha256 = hit[0]
    else:
        row = await store.console_session_resolve(app[api.POOL], key, settings.console_session_idle_s,
                                                  settings.console_session_max_s, now=clock.db_now())
        if row is None:
            cache.pop(key, None)
            return None
        token_sha256 = bytes(row["token_sha256"])
        if ttl > 0:
            until = min(now + ttl, now + (row["expires_at"] - clock.now()).total_seconds())
            if len(cache) >= 10_000:
                cache.clear()
            cache[key] = (token_sha256, until)
    p = await tokens.principal_of_digest(app, token_sha256)
    if p is None:
        cache.pop(key, None)
    return p


def check_csrf(request: web.Request, session_id: str) -> None:
    """Raise 403 ``csrf_failed`` unless a cookie-authenticated mutation carries the session's
    CSRF token and comes from this origin."""
    origin = request.headers.get("Origin")
    if origin is not None and origin != f"{_scheme(request)}://{request.host}":
        raise Forbidden(f"Origin {origin!r} is not this console's origin", code="csrf_failed",
                        details=[{"header": "Origin"}])
    given = request.headers.get(CSRF_HEADER, "")
    if not hmac.compare_digest(given.encode(), csrf_token(session_id).encode()):
        raise Forbidden(f"a request authenticated by the console's cookie needs the {CSRF_HEADER} header of its "
                        "session (GET /console/session)", code="csrf_failed", details=[{"header": CSRF_HEADER}])


def _scheme(request: web.Request) -> str:
    forwarded = request.headers.get("X-Forwarded-Proto", "").split(",")[0].strip().lower()
    return "https" if request.secure or forwarded == "https" else "http"


def _headers(cache: bool = False) -> dict[str, str]:
    return {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
            "X-Frame-Options": "DENY", "Cache-Control": "public, max-age=300" if cache else "no-store"}


async def page(request: web.Request) -> web.Response:
    """Every console address answers the one page; the page routes by its path."""
    return web.Response(body=(STATIC / "index.html").read_bytes(), headers={**_headers(), "Content-Type": _TYPES[".html"]})


async def static(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    path = (STATIC / name).resolve()
    if STATIC.resolve() not in path.parents or not path.is_file() or path.suffix not in _TYPES:
        raise web.HTTPNotFound()
    return web.Response(body=path.read_bytes(), headers={**_headers(cache=False), "Content-Type": _TYPES[path.suffix]})


async def _session_body(request: web.Request, p: Any, session_id: str) -> dict[str, Any]:
    from .. import resources as api

    return {"tenant": p.tenant_id, "tenant_name": await store.tenant_name(request.app[api.POOL], p.tenant_id),
            "token_id": p.token_id, "scopes": sorted(p.scopes),
            "csrf_token": csrf_token(session_id), "expires_at": p.expires_at.isoformat() if p.expires_at else None}


def _clear_cookie(request: web.Request, resp: web.Response) -> None:
    if _scheme(request) == "https":
        resp.del_cookie(SECURE_COOKIE, path="/", secure=True, httponly=True, samesite="Strict")
    else:
        resp.del_cookie(COOKIE, path="/")


async def _end(request: web.Request, session_id: str) -> None:
    from .. import resources as api

    if _SESSION_ID.fullmatch(session_id):
        request.app[SESSIONS].pop(_digest(session_id), None)
        await store.console_session_revoke(request.app[api.POOL], _digest(session_id),
                                           now=api.clock_of(request.app).db_now())


async def sign_in(request: web.Request) -> web.Response:
    origin = request.headers.get("Origin")
    if origin is not None and origin != f"{_scheme(request)}://{request.host}":
        raise Forbidden(f"Origin {origin!r} is not this console's origin", code="csrf_failed")
    if request.content_type != "application/json":
        raise BadRequest("sign in with a JSON body {\"token\": …}")
    try:
        body = json.loads(await request.read() or b"null")
    except ValueError:
        raise BadRequest("request body is not valid JSON")
    token = body.get("token") if isinstance(body, dict) else None
    if not isinstance(token, str) or not token.strip():
        raise BadRequest("token: an API token is required", details=[{"field": "token", "message": "required"}])
    token = token.strip()
    from .. import resources as api
    from .. import tokens

    p = await tokens.authenticate(request, token)  # the failed-authentication limiter, as Bearer
    if p is None:
        raise tokens.unauthorized("unknown, expired or revoked API token")
    old = request.cookies.get(cookie_name(request))
    if old:  # rotation: the session the browser came with (planted or not) is not the new one
        await _end(request, old.strip())
    session_id = new_session_id()
    settings = request.app[api.SETTINGS]
    expires_at = await store.console_session_create(request.app[api.POOL], _digest(session_id), p.token_id,
                                                    settings.console_session_idle_s, settings.console_session_max_s,
                                                    now=api.clock_of(request.app).db_now())
    resp = web.json_response({"signed_in": True, **(await _session_body(request, p, session_id)),
                              "session_expires_at": expires_at.isoformat()}, headers=_headers())
    secure = _scheme(request) == "https"
    resp.set_cookie(SECURE_COOKIE if secure else COOKIE, session_id, httponly=True, samesite="Strict",
                    secure=secure, path="/")
    return resp


async def session(request: web.Request) -> web.Response:
    from .. import tokens

    session_id = request.cookies.get(cookie_name(request), "").strip()
    p = None
    if session_id:
        if not session_cached(request.app, session_id):
            tokens.limit_failures(request)
        p = await session_principal(request.app, session_id)
        if p is None:
            tokens.authentication_failed(request)
    if p is None:  # 200, not 401: a page not yet signed in is no error
        resp = web.json_response({"signed_in": False}, headers=_headers())
        if session_id:
            _clear_cookie(request, resp)
        return resp
    return web.json_response({"signed_in": True, **(await _session_body(request, p, session_id))}, headers=_headers())


async def sign_out(request: web.Request) -> web.Response:
    from .. import tokens

    session_id = request.cookies.get(cookie_name(request), "").strip()
    if session_id:
        if not session_cached(request.app, session_id):
            tokens.limit_failures(request)
        if await session_principal(request.app, session_id) is not None:
            check_csrf(request, session_id)
        else:  # a bad (or already ended) session cookie: a failed authentication, like anywhere else
            tokens.authentication_failed(request)
        await _end(request, session_id)  # a copy of the cookie no longer authenticates
    resp = web.json_response({"signed_out": True}, headers=_headers())
    _clear_cookie(request, resp)
    return resp


async def root(request: web.Request) -> web.Response:
    raise web.HTTPFound("/console/")


def install(app: web.Application) -> None:
    """The console's routes (outside ``/v1``: not in the OpenAPI document)."""
    app[SESSIONS] = {}
    app.router.add_get("/", root)
    app.router.add_get("/console", root)
    app.router.add_post("/console/session", sign_in)
    app.router.add_get("/console/session", session)
    app.router.add_delete("/console/session", sign_out)
    app.router.add_get("/console/static/{name}", static)
    app.router.add_get("/console/{tail:.*}", page)
