"""A plan without a job: what the job converging a resource would do now, from that job's own
``observe`` and ``plan`` (``POST /v1/<plural>/{id}/actions/plan``, ``z9 <kind> plan``, the
periodic drift check).

One code path: the resource type says which of its jobs converges a row to its intent, with what
arguments (``ResourceType.plan_of`` → :class:`~z9.resources.PlanOf`); that kind's ``observe(ctx)``
reads the world and its pure ``plan(job, world)`` lists the steps still missing — the very functions
the executor's runner calls (:func:`z9.executor.runner.run_job`). Each step says what it fixes
(:attr:`~z9.executor.context.Step.drift`), why, and whether it interrupts the guest
(:attr:`~z9.executor.context.Step.interrupts`).

Nothing is written, by construction rather than by care:

- Proxmox: the region's client is read-only (``ProxmoxClient(read_only=True)``): any request but a
  GET is refused before it is sent (:class:`~z9.executor.proxmox.ReadOnlyRefused`).
- the database: ``ctx.pool`` is either one connection inside a ``READ ONLY`` transaction (the reaper's)
  or a :class:`ReadOnlyPool` (the API's), whose every query runs in a ``READ ONLY`` transaction of its
  own on a pool connection taken for that query alone: PostgreSQL refuses every write in it and every
  row lock (``SELECT … FOR UPDATE`` "cannot be executed in a read-only transaction"), so a plan takes
  no job lease and locks no row. With a :class:`ReadOnlyPool` a plan holds no connection while it waits
  on Proxmox (its reads see the database as a job's do: each query its own snapshot).
- the job: there is none. :class:`PlanContext` refuses every write a running job makes (steps, memo,
  fence); ``observe`` code that must differ reads :attr:`JobContext.read_only` (the private
  address a server would be given is looked up, not taken).
"""
from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from z9.common import store
from z9.common.clock import SYSTEM, Clock
from z9.common.errors import Snooze, TemporaryError
from z9.common.models import Job
from z9.common.settings import Settings

from z9 import resources

from .context import Drift, JobContext, Step
from .jobs import REGISTRY
from .proxmox import ProxmoxClient, ReadOnlyRefused

PLAN_OWNER = "plan"  # the lease owner a plan's context names (it has no lease: nothing is fenced)
PLAN_SESSION = "z9-plan"  # the application_name of a plan's transactions (pg_stat_activity)


class ReadOnlyPool:
    """The database as a plan reads it: ``fetch``/``fetchrow``/``fetchval``/``execute`` and
    ``acquire()`` as an asyncpg pool's, each on a connection of ``pool`` taken for that query (or
    that ``acquire`` block) alone, inside a ``READ ONLY`` transaction named :data:`PLAN_SESSION` in
    pg_stat_activity. A plan waiting on Proxmox holds no connection and no transaction."""

    def __init__(self, pool: Any):
        self._pool = pool

    @asynccontextmanager
    async def acquire(self) -> AsyncIterator[Any]:
        async with self._pool.acquire() as conn, conn.transaction(readonly=True):
            await store.session_name_local(conn, PLAN_SESSION)
            yield conn

    async def fetch(self, query: str, *args: Any, **kw: Any) -> Any:
        async with self.acquire() as conn:
            return await conn.fetch(query, *args, **kw)

    async def fetchrow(self, query: str, *args: Any, **kw: Any) -> Any:
        async with self.acquire() as conn:
            return await conn.fetchrow(query, *args, **kw)

    async def fetchval(self, query: str, *args: Any, **kw: Any) -> Any:
        async with self.acquire() as conn:
            return await conn.fetchval(query, *args, **kw)

    async def execute(self, query: str, *args: Any, **kw: Any) -> Any:
        async with self.acquire() as conn:
            return await conn.execute(query, *args, **kw)


class PlanContext(JobContext):
    """A job's context for a plan: the kind's observe runs on it; every write refuses."""

    read_only = True

    def __init__(self, job: Job, conn: Any, pve: ProxmoxClient, settings: Settings, clock: Clock = SYSTEM):
        super().__init__(job, PLAN_OWNER, conn, pve, settings, clock=clock)
        self.claimed_at = time.monotonic()  # a negative answer needs a listing newer than the plan

    def _refuse(self, what: str) -> ReadOnlyRefused:
        return ReadOnlyRefused(f"a plan writes nothing: {self.job.kind}'s observe tried to {what}")

    async def fence(self) -> None:
        raise self._refuse("send a mutating request")

    async def _write_steps(self) -> None:
        raise self._refuse("record a step")

    async def set_plan(self, steps: list[Step]) -> None:
        raise self._refuse("record its plan")

    async def remember(self, **facts: Any) -> None:
        raise self._refuse(f"remember {sorted(facts)}")

    async def succeed(self, kind: Any, observed: Any) -> None:
        raise self._refuse("finish")


@dataclass
class Plan:
    """What a plan found: the kind it previewed and its steps (each with the drift it fixes)."""

    kind: str | None
    steps: list[Step] = field(default_factory=list)
    # the job would wait on the world first (its plan snoozed: a VM locked by another task, an image
    # not there yet): why; the steps after the wait are not known yet
    waiting: str | None = None

    @property
    def in_sync(self) -> bool:
        return not self.steps and self.waiting is None

    @property
    def drift(self) -> list[Drift]:
        """Every difference the steps fix, each once, in plan order."""
        out: list[Drift] = []
        for d in (d for s in self.steps for d in s.drift):
            if d not in out:  # (values may be lists: compared, not hashed)
                out.append(d)
        return out

    def as_json(self) -> dict[str, Any]:
        return {"in_sync": self.in_sync, "job_kind": self.kind, "drift": [d.as_json() for d in self.drift],
                "steps": [s.preview() for s in self.steps], "waiting": self.waiting}


def _job(rtype: resources.ResourceType[Any], row: Any, of: resources.PlanOf) -> Job:
    """The job the plan previews, as a row it would be (never inserted)."""
    now = datetime.now(UTC)
    return Job(id="job_plan", seq=0, kind=of.kind, region=row.region, tenant_id=row.tenant_id,
               resource_type=rtype.name, resource_id=row.id, args=dict(of.args), status="running", attempt=1,
               max_attempts=1, run_after=now, lease_owner=PLAN_OWNER, lease_expires_at=None, steps=[], memo={},
               error=None, trace_context=None, created_at=now, started_at=now, finished_at=None, updated_at=now)


async def plan(conn: Any, pve: ProxmoxClient, settings: Settings, rtype: resources.ResourceType[Any], row: Any,
               *, clock: Clock = SYSTEM) -> Plan:
    """The plan of ``row`` now: its converging job's observe and plan, read-only. ``conn`` must be
    a connection in a read-only transaction (the caller's) or a :class:`ReadOnlyPool`. A plan that snoozes (the world is busy: a VM locked, an
    image not there yet), or that meets a temporary error of its own (a server without its VM yet: the job
    would try again), is answered as ``waiting``. Raises what observe and plan raise otherwise
    (TemporaryError: Proxmox trouble; PermanentError, GuardRefusal: the job would fail)."""
    of = await rtype.plan_of(conn, row) if rtype.plan_of is not None else None
    if of is None:
        return Plan(kind=None)
    kind = REGISTRY[of.kind]
    job = _job(rtype, row, of)
    ctx = PlanContext(job, conn, pve, settings, clock)
    try:
        steps = kind.plan(job, await kind.observe(ctx))
    except Snooze as e:
        return Plan(kind=of.kind, waiting=str(e))
    except TemporaryError as e:
        if e.__cause__ is not None:  # translated from Proxmox's answer (or its absence): no plan now
            raise
        return Plan(kind=of.kind, waiting=f"{e} (the job would try again)")  # the world not ready for it yet
    return Plan(kind=of.kind, steps=[s for s in steps if s.name not in of.leave_out])
