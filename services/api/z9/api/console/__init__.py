"""The web console: a single page served by the API process under ``/console``, calling the same
``/v1`` API (same scopes, quotas, rate limits) from the browser.

- **Signing in.** ``POST /console/session {"token"}`` checks the API token and answers it in an
  ``HttpOnly``, ``SameSite=Strict`` cookie (``Secure`` when the request came over HTTPS, or
  through a proxy saying ``X-Forwarded-Proto: https``), never readable by the page's scripts;
  ``GET /console/session`` tells the page who it is (tenant, scopes) and its CSRF token
  (``{"signed_in": false}`` without a valid cookie);
  ``DELETE /console/session`` signs out (the cookie is cleared).
- **CSRF.** A ``/v1`` request authenticated by the cookie (no ``Authorization`` header) that is
  not a GET must carry ``X-CSRF-Token``: an HMAC of the session's token, so only a page that
  asked ``GET /console/session`` (same origin: SameSite=Strict and no CORS) knows it; without
  it, or with another one, 403 ``csrf_failed``. An ``Origin`` header naming another origin is
  refused too. Bearer-token clients are unaffected (no cookie involved).
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
from pathlib import Path
from typing import Any

from aiohttp import web

from z9.common.errors import BadRequest, Forbidden

STATIC = Path(__file__).with_name("static")
COOKIE = "z9_console"
CSRF_HEADER = "X-CSRF-Token"
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "font-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
_TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8",
          ".html": "text/html; charset=utf-8", ".svg": "image/svg+xml"}


def csrf_token(token: str) -> str:
    """The CSRF token of a console session: HMAC-SHA256 of a fixed text under the session's API
    token (stateless, the same on every API replica, unknowable without the token)."""
    return hmac.new(token.encode(), b"z9 console csrf v1", hashlib.sha256).hexdigest()


def cookie_token(request: web.Request) -> str | None:
    """The API token of the console cookie, when the request carries one and no Authorization."""
    if "Authorization" in request.headers:
        return None
    value = request.cookies.get(COOKIE)
    return value if value else None


def check_csrf(request: web.Request, token: str) -> None:
    """Raise 403 ``csrf_failed`` unless a cookie-authenticated mutation carries the session's
    CSRF token and comes from this origin."""
    origin = request.headers.get("Origin")
    if origin is not None and origin != f"{_scheme(request)}://{request.host}":
        raise Forbidden(f"Origin {origin!r} is not this console's origin", code="csrf_failed",
                        details=[{"header": "Origin"}])
    given = request.headers.get(CSRF_HEADER, "")
    if not hmac.compare_digest(given.encode(), csrf_token(token).encode()):
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


async def _who(request: web.Request, token: str) -> Any:
    from .. import tokens

    return await tokens._principal(request.app, token) if token.isascii() and len(token) <= 200 else None


def _session_body(p: Any, token: str) -> dict[str, Any]:
    return {"tenant": p.tenant_id, "token_id": p.token_id, "scopes": sorted(p.scopes), "csrf_token": csrf_token(token),
            "expires_at": p.expires_at.isoformat() if p.expires_at else None}


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
    from .. import tokens

    p = await _who(request, token)
    if p is None:
        failures = request.app[tokens.AUTH_FAILURES]
        if failures.enabled:
            failures.take(tokens.client_key(request.remote))
        raise tokens.unauthorized("unknown, expired or revoked API token")
    resp = web.json_response({"signed_in": True, **_session_body(p, token)}, headers=_headers())
    resp.set_cookie(COOKIE, token, httponly=True, samesite="Strict", secure=_scheme(request) == "https", path="/")
    return resp


async def session(request: web.Request) -> web.Response:
    from .. import tokens

    token = request.cookies.get(COOKIE)
    p = await _who(request, token) if token else None
    if p is None:  # 200, not 401: a page not yet signed in is no error
        return web.json_response({"signed_in": False}, headers=_headers())
    return web.json_response({"signed_in": True, **_session_body(p, token)}, headers=_headers())  # type: ignore[arg-type]


async def sign_out(request: web.Request) -> web.Response:
    token = request.cookies.get(COOKIE)
    if token:
        check_csrf(request, token)
    resp = web.json_response({"signed_out": True}, headers=_headers())
    resp.del_cookie(COOKIE, path="/")
    return resp


async def root(request: web.Request) -> web.Response:
    raise web.HTTPFound("/console/")


def install(app: web.Application) -> None:
    """The console's routes (outside ``/v1``: not in the OpenAPI document)."""
    app.router.add_get("/", root)
    app.router.add_get("/console", root)
    app.router.add_post("/console/session", sign_in)
    app.router.add_get("/console/session", session)
    app.router.add_delete("/console/session", sign_out)
    app.router.add_get("/console/static/{name}", static)
    app.router.add_get("/console/{tail:.*}", page)
