"""Connection hygiene of the API's listener: one client cannot take the process down.

- **Descriptors.** ``z9 api`` raises its soft ``RLIMIT_NOFILE`` to the hard limit at start
  (:func:`raise_nofile_limit`). The connections it keeps open are capped *under* that limit —
  ``Z9_API_MAX_CONNECTIONS``, lowered to the descriptor limit less a reserve for the database
  pool, the metrics listener and the connections being accepted — so ``accept()`` never meets
  ``EMFILE`` (asyncio would log ``socket.accept() out of system resource`` for it, once per
  pending connection per loop tick: the flood seen at 4,200 idle connections).
- **Per client address.** At most ``Z9_API_MAX_CONNECTIONS_PER_ADDRESS`` open connections per
  peer address. A connection over either cap is answered ``503`` (JSON, ``Retry-After: 1``,
  ``Connection: close``) and closed at once, before any byte of it is read; counted in
  ``z9_api_connections_refused_total{reason}``, logged at a bounded rate (never a line each).
- **Slow clients.** A request's headers must be complete ``Z9_API_HEADER_TIMEOUT_S`` after its
  first byte; its body ``Z9_API_BODY_TIMEOUT_S`` after its headers; a connection sending
  nothing (new, or idle between requests) is closed after ``Z9_API_IDLE_TIMEOUT_S`` (aiohttp's
  ``keepalive_timeout``, which also covers a new connection that never sends a byte). Each cut
  is counted (``reason`` ``header_timeout``/``body_timeout``) and logged at a bounded rate.
- **The loop's own errors** (:func:`install_loop_exception_handler`) are logged at a bounded rate.
"""
from __future__ import annotations

import asyncio
import json
import logging
import resource
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from z9.common import metrics

log = logging.getLogger("z9.api")

#: descriptors kept free of client connections: the database pool's, LISTEN, the metrics
#: listener, log files, and up to one accept backlog (100) of connections not yet counted
RESERVED_FDS = 256


def raise_nofile_limit() -> tuple[int, int]:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard limit; ``(soft, hard)`` after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard or hard == resource.RLIM_INFINITY and soft < 1 << 20:
        want = hard if hard != resource.RLIM_INFINITY else 1 << 20
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        except (ValueError, OSError) as e:  # a container may forbid it: keep the soft limit
            log.warning("could not raise the descriptor limit from %d to %d: %s", soft, want, e)
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def connection_cap(configured: int, pool_size: int = 16) -> int:
    """``configured`` (``Z9_API_MAX_CONNECTIONS``), lowered to what the current descriptor limit
    leaves after the reserve; at least 1."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return configured
    return max(1, min(configured, soft - RESERVED_FDS - 2 * pool_size))


class RateLimitedLog:
    """At most ``burst`` lines per ``window_s`` per key; the lines held back are counted and said
    in the next line let through (``… (N more like it since …)``)."""

    def __init__(self, logger: logging.Logger, burst: int = 5, window_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic):
        self.logger, self.burst, self.window_s, self.clock = logger, burst, window_s, clock
        self._state: dict[str, list[float]] = {}  # key -> [window start, lines in window, held back]

    def log(self, level: int, key: str, msg: str, *args: Any, exc_info: bool = False) -> bool:
        now = self.clock()
        st = self._state.get(key)
        if st is None or now - st[0] >= self.window_s:
            held = int(st[2]) if st else 0
            st = self._state[key] = [now, 0, 0]
            if held:
                msg += f" ({held} more like it in the previous {self.window_s:g}s not logged)"
        if st[1] >= self.burst:
            st[2] += 1
            return False
        st[1] += 1
        self.logger.log(level, msg, *args, exc_info=exc_info)
        return True


@dataclass
class ConnectionLimits:
    """Open connections of one listener, per peer address and in all."""

    per_address: int
    total: int
    header_timeout_s: float
    body_timeout_s: float
    open: int = 0
    by_address: dict[str, int] = field(default_factory=dict)
    rlog: RateLimitedLog = field(default_factory=lambda: RateLimitedLog(log))

    @classmethod
    def from_settings(cls, settings: Any) -> "ConnectionLimits":
        return cls(per_address=settings.api_max_connections_per_address,
                   total=connection_cap(settings.api_max_connections, settings.api_pool_size),
                   header_timeout_s=settings.api_header_timeout_s, body_timeout_s=settings.api_body_timeout_s)

    def admit(self, address: str) -> str | None:
        """Count a new connection from ``address``; the reason it is refused (nothing counted), or None."""
        if self.open >= self.total:
            return "total"
        if self.by_address.get(address, 0) >= self.per_address:
            return "per_address"
        self.open += 1
        self.by_address[address] = self.by_address.get(address, 0) + 1
        return None

    def release(self, address: str) -> None:
        self.open -= 1
        left = self.by_address.get(address, 1) - 1
        if left > 0:
            self.by_address[address] = left
        else:
            self.by_address.pop(address, None)

    def refused(self, address: str, reason: str) -> None:
        metrics.API_CONNECTIONS_REFUSED.labels(reason).inc()
        what = (f"{self.per_address} from one address" if reason == "per_address"
                else f"{self.total} in all")
        self.rlog.log(logging.WARNING, "refused:" + reason, "connection from %s refused: over the cap of %s",
                      address, what)

    def cut(self, address: str, reason: str) -> None:
        metrics.API_CONNECTIONS_REFUSED.labels(reason).inc()
        limit = self.header_timeout_s if reason == "header_timeout" else self.body_timeout_s
        self.rlog.log(logging.INFO, "cut:" + reason, "connection from %s closed: %s (%gs)", address,
                      reason.replace("_", " "), limit)


OVER_CAP_ANSWER = (lambda body: (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                                 b"Retry-After: 1\r\nConnection: close\r\nContent-Length: "
                                 + str(len(body)).encode() + b"\r\n\r\n" + body))(json.dumps(
    {"error": {"code": "too_many_connections",
               "message": "too many connections open from this address or in all; retry shortly", "details": []}}
).encode())


def install_loop_exception_handler(loop: asyncio.AbstractEventLoop) -> None:
    """The loop's own errors (a failed ``accept()``, a callback that raised) logged at a bounded
    rate per message instead of once each."""
    rlog = RateLimitedLog(logging.getLogger("z9.api.loop"))

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        msg = str(context.get("message") or "event loop error")
        exc = context.get("exception")
        rlog.log(logging.ERROR, msg, "%s%s", msg, f": {type(exc).__name__}: {exc}" if exc is not None else "")

    loop.set_exception_handler(handler)
