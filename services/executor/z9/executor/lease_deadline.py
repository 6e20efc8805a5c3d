"""The lease's local deadline: no Proxmox call leaves the process once the job's lease may be gone.

A lease is renewed in the database (claim, heartbeat, every fenced progress write) for
``lease_ttl_s`` seconds from the *database's* time of the write. An executor that stops running
(SIGSTOP, a frozen VM, a long GC pause) learns that it lost the lease only at its next fenced
write; calls it sends before that — a task poll whose sleep ended, the next step's start — reach
Proxmox while another attempt may run the job elsewhere. So each attempt keeps a local deadline
on the monotonic clock: the time a renewal was *sent* (never later than the database's time of
it) plus ``lease_ttl_s`` minus ``lease_safety_margin_s``. The region's client
(:class:`z9.executor.proxmox.ProxmoxClient`) checks it in the thread that sends a request, right
before the request leaves (:class:`LeaseHeaderAdapter`), and refuses to send after it with
:class:`LeaseExpired` (a :class:`LeaseLost`: the runner abandons the attempt and writes nothing).

The attempt's deadline is bound to the job's task (:data:`CURRENT`, a context variable: the
threads of the client run each call in a copy of the caller's context). A request that is sent
carries the attempt's fencing token in ``X-Z9-Lease: <job>/<attempt>/<owner>`` (Proxmox ignores
headers it does not know; the simulator keeps it in its request log, so a test counts the calls
of a lost lease). Requests made for no job (the process's shared ``/cluster/resources``
snapshot) carry none and are not checked.
"""
from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from datetime import datetime
from typing import Any

from requests.adapters import HTTPAdapter
from z9.common.clock import Clock
from z9.common.errors import LeaseLost

#: the header carrying the attempt's fencing token on every request sent for a job
HEADER = "X-Z9-Lease"


class LeaseExpired(LeaseLost):
    """The attempt's local lease deadline has passed: a Proxmox call was refused before it was
    sent (the lease may be held by another attempt by now)."""


class LeaseDeadline:
    """The local deadline of one attempt's lease (monotonic seconds of ``clock``)."""

    def __init__(self, job_id: str, attempt: int, owner: str, *, ttl_s: float, margin_s: float, clock: Clock,
                 expires_at: datetime | None = None):
        self.job_id, self.attempt, self.owner = job_id, attempt, owner
        self.ttl_s, self.margin_s, self.clock = ttl_s, margin_s, clock
        now = clock.monotonic()
        # The claim was sent before this object was made: the database's expiry, as far as the
        # clocks agree (the margin covers their skew), is the earlier bound — an executor stopped
        # between its claim and here starts with the time it has left, not a fresh TTL.
        self.deadline = now + ttl_s - margin_s
        if expires_at is not None:
            left = (expires_at - clock.now()).total_seconds()
            self.deadline = min(self.deadline, now + left - margin_s)

    @property
    def token(self) -> str:
        """The fencing token: ``<job>/<attempt>/<owner>``."""
        return f"{self.job_id}/{self.attempt}/{self.owner}"

    def renewed(self, sent_at: float) -> None:
        """A renewal sent at ``sent_at`` (this clock's monotonic time, read before it was sent)
        was accepted: the lease runs ``ttl_s`` from the database's time of it, which is later."""
        self.deadline = max(self.deadline, sent_at + self.ttl_s - self.margin_s)

    def left_s(self) -> float:
        return self.deadline - self.clock.monotonic()

    def check(self, what: str) -> None:
        """Raise :class:`LeaseExpired` when the deadline has passed."""
        left = self.left_s()
        if left <= 0:
            raise LeaseExpired(f"job {self.job_id}: the lease of {self.owner} (attempt {self.attempt}) may be gone "
                               f"({-left:.1f}s past its local deadline, {self.margin_s:.0f}s before its TTL); "
                               f"not sending {what}")


#: the deadline of the attempt the running code works for (None: no job's)
CURRENT: contextvars.ContextVar[LeaseDeadline | None] = contextvars.ContextVar("z9_lease_deadline", default=None)


def bind(deadline: LeaseDeadline) -> contextvars.Token[LeaseDeadline | None]:
    """Bind ``deadline`` to the current context (a job's task)."""
    return CURRENT.set(deadline)


@contextlib.contextmanager
def unbound() -> Iterator[None]:
    """Code that works for no job (a read shared by every job of the process)."""
    token = CURRENT.set(None)
    try:
        yield
    finally:
        CURRENT.reset(token)


def check(what: str) -> None:
    """Check the current attempt's deadline (nothing when the code works for no job)."""
    lease = CURRENT.get()
    if lease is not None:
        lease.check(what)


class LeaseHeaderAdapter(HTTPAdapter):
    """The HTTPS adapter of a region's session: the last place before a request leaves. It checks
    the deadline of the attempt the request is sent for and adds its fencing token."""

    def send(self, request: Any, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        lease = CURRENT.get()
        if lease is not None:
            lease.check(f"{request.method} {request.path_url.split('?')[0]}")
            request.headers[HEADER] = lease.token
        return super().send(request, *args, **kwargs)
