"""HTTP as clients expect it: request ids, ``Location`` on 202, ``Allow`` on 405, unknown query
parameters refused, rate limits per token, and malformed requests answered in the JSON error
shape.

- ``X-Request-Id``: the client's (1-200 printable ASCII characters) or a new ``req_…``; echoed
  on every answer, on every log line logged while the request is served (``request_id``), and
  stored on every job the request makes (``jobs.request_id``).
- ``Location: /v1/jobs/{id}`` on every 202 (the job to follow); ``Allow`` on every 405.
- A query parameter the route does not declare in the OpenAPI document answers 400 naming it:
  a misspelt filter must never widen what a script acts on.
- Rate limit per tenant (all of a tenant's tokens spend from one bucket): a token bucket per API
  process (``Z9_API_RATE_LIMIT_BURST`` requests, refilled at ``Z9_API_RATE_LIMIT_PER_S``; 0 turns
  it off). Every answer to a token carries
  ``RateLimit-Policy: "token";q=<burst>;w=<seconds to refill>`` and
  ``RateLimit: "token";r=<remaining>;t=<seconds until full>`` (IETF httpapi ratelimit-headers);
  over the limit: 429 ``rate_limited`` with ``Retry-After``.
- A request aiohttp's parser rejects (a raw 0xFF in the path, NUL or CR in a header) never
  reaches the middlewares: :class:`Runner` serves the app with a protocol handler that answers
  it ``{"error": …}`` with one WARNING line instead of a text body and a traceback at ERROR.
"""
from __future__ import annotations

import asyncio
import json
import logging
import math
import re
import secrets
import time
from typing import Any, Awaitable, Callable

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from z9.common import metrics
from z9.common.errors import ApiError, BadRequest, TooManyRequests, ValidationFailed
from z9.common.requestctx import REQUEST_ID
from z9.common.shutdown import guard_stop

from . import connections

log = logging.getLogger("z9.api")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

_REQUEST_ID_RE = re.compile(r"[\x21-\x7e]{1,200}")


def _new_request_id() -> str:
    return "req_" + secrets.token_hex(12)


@web.middleware
async def request_id_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Outermost: the request id, ``Location`` on 202, ``Allow`` on 405."""
    given = request.headers.get("X-Request-Id")
    rid = given if given is not None and _REQUEST_ID_RE.fullmatch(given) else _new_request_id()
    REQUEST_ID.set(rid)
    try:
        response = await handler(request)
    except web.HTTPException as e:  # a redirect or anything not turned into JSON further in
        e.headers["X-Request-Id"] = rid
        raise
    response.headers["X-Request-Id"] = rid
    if response.status == 202 and "Location" not in response.headers:
        job_id = _job_id(response)
        if job_id:
            response.headers["Location"] = f"/v1/jobs/{job_id}"
    elif response.status == 405 and "Allow" not in response.headers:
        exc = getattr(request.match_info, "http_exception", None)
        allowed = getattr(exc, "allowed_methods", None)
        if allowed:
            response.headers["Allow"] = ",".join(sorted(allowed))
    return response


def _job_id(response: web.StreamResponse) -> str | None:
    body = getattr(response, "body", None)
    if not isinstance(body, bytes):
        return None
    try:
        job = json.loads(body).get("job")
    except (ValueError, AttributeError):
        return None
    return job.get("id") if isinstance(job, dict) and isinstance(job.get("id"), str) else None


# ---------------------------------------------------------------------------------- query parameters

QUERY_PARAMS = web.AppKey("query_params", dict)  # (method, route template) → allowed names


def declared_query_params(document: dict[str, Any], prefix: str = "/v1") -> dict[tuple[str, str], frozenset[str]]:
    """``{(METHOD, "/v1/path/{id}"): {names}}`` of every operation of an OpenAPI document."""
    out: dict[tuple[str, str], frozenset[str]] = {}
    for path, ops in document.get("paths", {}).items():
        for method, op in ops.items():
            if not isinstance(op, dict) or method.startswith("x-") or method == "parameters":
                continue
            params = list(ops.get("parameters", [])) + list(op.get("parameters", []))
            out[(method.upper(), prefix + path)] = frozenset(p["name"] for p in params if p.get("in") == "query")
    return out


@web.middleware
async def query_params_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """400 naming every query parameter the matched route does not declare, or given more than once
    (first: an undeclared
    one is the request's first fault, and a route without query parameters documents no 422); then
    422 naming every one whose value holds a NUL character (no database text can: PostgreSQL refuses the statement,
    which would otherwise be a 500 for whichever filter reached it)."""
    resource = request.match_info.route.resource
    if resource is not None and request.query:
        allowed = request.app[QUERY_PARAMS].get((request.method, resource.canonical))
        if allowed is not None:
            unknown = sorted({k for k in request.query if k not in allowed})
            if unknown:
                accepted = ", ".join(sorted(allowed)) or "none"
                raise BadRequest(f"unknown query parameter{'s' if len(unknown) > 1 else ''}: {', '.join(unknown)} "
                                 f"({request.method} {resource.canonical} accepts: {accepted})",
                                 code="unknown_parameter",
                                 details=[{"field": k, "message": "unknown query parameter"} for k in unknown])
    if request.query:  # a filter given twice would be read once (the first): never silently
        repeated = sorted({k for k in request.query if len(request.query.getall(k)) > 1})
        if repeated:
            raise BadRequest(f"query parameter{'s' if len(repeated) > 1 else ''} given more than once: "
                             f"{', '.join(repeated)} (give each once)", code="repeated_parameter",
                             details=[{"field": k, "message": "given more than once"} for k in repeated])
    if request.query:  # after the 400s: only a declared parameter (documented with its 422) gets here
        nul = sorted({k for k, v in request.query.items() if "\x00" in v})
        if nul:
            raise ValidationFailed(f"{', '.join(nul)}: a query parameter's value cannot contain a NUL character",
                                   details=[{"field": k, "message": "contains a NUL character"} for k in nul])
    return await handler(request)


# ---------------------------------------------------------------------------------- rate limits

class TokenBuckets:
    """A token bucket per API token: ``burst`` requests at once, refilled at ``per_s``."""

    def __init__(self, per_s: float, burst: int, *, max_entries: int = 100_000,
                 clock: Callable[[], float] = time.monotonic):
        self.per_s = per_s
        self.burst = burst
        self.max_entries = max_entries
        self.clock = clock  # seconds, monotonic (tests replace it)
        self._buckets: dict[str, tuple[float, float]] = {}  # token id → (level, monotonic time)

    @property
    def enabled(self) -> bool:
        return self.per_s > 0 and self.burst > 0

    def take(self, key: str, now: float | None = None) -> tuple[bool, float]:
        """Spend one unit of ``key``'s bucket; (allowed, level after)."""
        now = self.clock() if now is None else now
        level, at = self._buckets.get(key, (float(self.burst), now))
        level = min(float(self.burst), level + (now - at) * self.per_s)
        allowed = level >= 1.0
        if allowed:
            level -= 1.0
        if len(self._buckets) >= self.max_entries and key not in self._buckets:
            self._buckets.clear()  # full buckets are the default: forgetting only forgives
        self._buckets[key] = (level, now)
        return allowed, level

    def headers(self, level: float) -> dict[str, str]:
        window = max(1, math.ceil(self.burst / self.per_s))
        until_full = max(0, math.ceil((self.burst - level) / self.per_s))
        return {"RateLimit-Policy": f'"token";q={self.burst};w={window}',
                "RateLimit": f'"token";r={int(level)};t={until_full}'}

    def retry_after(self, level: float) -> int:
        return max(1, math.ceil((1.0 - level) / self.per_s))


RATE_LIMITS = web.AppKey("rate_limits", TokenBuckets)


@web.middleware
async def rate_limit_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """After authentication: spend one unit of the token's bucket, or 429."""
    from .tokens import PRINCIPAL

    buckets = request.app[RATE_LIMITS]
    principal = request.get(PRINCIPAL)
    if principal is None or not buckets.enabled:
        return await handler(request)
    allowed, level = buckets.take(principal.tenant_id)  # per tenant: a new token brings no new requests
    headers = buckets.headers(level)
    if not allowed:
        metrics.API_RATE_LIMITED.inc()
        wait = buckets.retry_after(level)
        raise TooManyRequests(f"rate limit of this tenant exceeded (all its tokens share it: {buckets.burst} "
                              f"requests, refilled at {buckets.per_s:g}/s); retry in {wait}s",
                              headers={**headers, "Retry-After": str(wait)})
    try:
        response = await handler(request)
    except (web.HTTPException, ApiError) as e:  # answered further out: the headers go along
        e.headers.update(headers)
        raise
    response.headers.update(headers)
    return response


# ---------------------------------------------------------------------------------- malformed requests

class _RequestHandler(RequestHandler):
    """aiohttp's protocol handler, but a request its parser rejects gets the JSON error shape
    and one WARNING line (no traceback); connections are capped and slow ones cut
    (:mod:`z9.api.connections`)."""

    _z9_address: str | None = None  # counted in the listener's limits while open
    _z9_header_timer: asyncio.TimerHandle | None = None
    _z9_body_timers: list[asyncio.TimerHandle] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        limits = getattr(self._manager, "z9_limits", None)
        if limits is None:
            return super().connection_made(transport)
        peer = transport.get_extra_info("peername")
        address = str(peer[0]) if isinstance(peer, (tuple, list)) and peer else "unknown"
        refused = limits.admit(address)
        if refused:  # before reading a byte: answer and close, no task, no parser state
            limits.refused(address, refused)
            self._manager = None  # connection_lost then does nothing
            try:
                transport.write(connections.OVER_CAP_ANSWER)  # type: ignore[attr-defined]
            finally:
                transport.close()
            return
        self._z9_address = address
        self._z9_body_timers = []
        super().connection_made(transport)

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._z9_address is not None:
            limits = getattr(self._manager, "z9_limits", None)
            if limits is not None:
                limits.release(self._z9_address)
            self._z9_address = None
            self._z9_stop_timers()
        super().connection_lost(exc)

    def _z9_stop_timers(self) -> None:
        if self._z9_header_timer is not None:
            self._z9_header_timer.cancel()
            self._z9_header_timer = None
        for t in self._z9_body_timers or ():
            t.cancel()
        self._z9_body_timers = []

    def data_received(self, data: bytes) -> None:
        limits = getattr(self._manager, "z9_limits", None)
        if limits is None or self._z9_address is None:
            return super().data_received(data)
        before = len(self._messages)
        idle = self._current_request is None and not self._messages and self._payload_parser is None
        super().data_received(data)
        parsed = list(self._messages)[before:] if len(self._messages) > before else []
        if parsed:
            if self._z9_header_timer is not None:
                self._z9_header_timer.cancel()
                self._z9_header_timer = None
            for _msg, payload in parsed:
                if hasattr(payload, "is_eof") and not payload.is_eof() and limits.body_timeout_s > 0:
                    now = self._loop.time()  # keep only the timers still to fire: a long keep-alive stays small
                    self._z9_body_timers = [t for t in self._z9_body_timers or ()
                                            if not t.cancelled() and t.when() > now]
                    self._z9_body_timers.append(self._loop.call_later(limits.body_timeout_s, self._z9_body_late,
                                                                      payload))
        elif idle and self._z9_header_timer is None and limits.header_timeout_s > 0 and data:
            # the first byte of a request's headers: they must be complete within the timeout
            self._z9_header_timer = self._loop.call_later(limits.header_timeout_s, self._z9_late, "header_timeout")

    def _z9_body_late(self, payload: Any) -> None:
        if not payload.is_eof():
            self._z9_late("body_timeout")

    def _z9_late(self, reason: str) -> None:
        self._z9_header_timer = None
        limits = getattr(self._manager, "z9_limits", None)
        if limits is not None and self._z9_address is not None:
            limits.cut(self._z9_address, reason)
        if self.transport is not None:
            self.transport.close()  # connection_lost follows: the body's reader sees the disconnect

    def handle_error(self, request: Any, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        if status >= 500:
            return super().handle_error(request, status, exc, message)
        reason = message or (str(exc) if exc is not None else "malformed request")
        reason = reason.splitlines()[0][:300] if reason else "malformed request"
        log.warning("malformed HTTP request from %s rejected (%d): %s", request.remote, status, reason)
        resp = web.json_response({"error": {"code": "bad_request", "message": f"malformed HTTP request: {reason}",
                                            "details": []}}, status=status)
        resp.force_close()
        return resp


class _Server(web.Server):
    z9_limits: connections.ConnectionLimits | None = None

    def __call__(self) -> RequestHandler:
        return _RequestHandler(self, loop=self._loop, **self._kwargs)


class Runner(web.AppRunner):
    """``web.AppRunner`` whose connections answer parser-rejected requests in JSON, capped per
    client address and in all, and cut when idle or slow (the app's settings, when it has them)."""

    async def _make_server(self) -> web.Server:
        from .resources import SETTINGS

        settings = self.app.get(SETTINGS)
        if settings is not None:
            self._kwargs.setdefault("keepalive_timeout", settings.api_idle_timeout_s)
        server = await super()._make_server()
        server.__class__ = _Server  # same state, one method differs
        if settings is not None:
            server.z9_limits = connections.ConnectionLimits.from_settings(settings)  # type: ignore[attr-defined]
        return server


async def serve(app: web.Application, host: str, port: int, *, metrics_app: web.Application | None = None,
                metrics_host: str = "127.0.0.1", metrics_port: int = 0) -> None:
    """Serve ``app`` on host:port until SIGINT/SIGTERM (what ``web.run_app`` does, with
    :class:`Runner`; the process ends at the latest ``Z9_SHUTDOWN_GRACE_S`` + 10 s after the
    signal, or at a second one: :mod:`z9.common.shutdown`), and ``metrics_app`` (``/metrics``) on its own listener when
    ``metrics_port`` is set — never on the tenants' port."""
    connections.install_loop_exception_handler(asyncio.get_running_loop())
    runner = Runner(app, access_log=None)
    await runner.setup()
    metrics_runner = web.AppRunner(metrics_app, access_log=None) if metrics_app is not None and metrics_port else None
    try:
        await web.TCPSite(runner, host, port).start()
        if metrics_runner is not None:
            await metrics_runner.setup()
            await web.TCPSite(metrics_runner, metrics_host, metrics_port).start()
        stop = asyncio.Event()
        from .resources import SETTINGS

        settings = app.get(SETTINGS)
        # the stop has a deadline: a database gone silent must not hold the process (z9.common.shutdown)
        guard_stop(stop.set, settings.shutdown_grace_s if settings is not None else 20.0)
        await stop.wait()
    finally:
        if metrics_runner is not None:
            await metrics_runner.cleanup()
        await runner.cleanup()


def install(app: web.Application, settings: Any, document: dict[str, Any]) -> None:
    """The query-parameter table (from ``document``, the OpenAPI document the app serves) and
    the rate limits of ``app``."""
    app[QUERY_PARAMS] = declared_query_params(document)
    app[RATE_LIMITS] = TokenBuckets(settings.api_rate_limit_per_s, settings.api_rate_limit_burst)
