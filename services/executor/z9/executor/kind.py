"""The contract of a job kind — the reconciler of one kind of change to one resource type — as a
:class:`typing.Protocol` the type checker holds every kind to (tests/unit/test_kind_contract.py runs
mypy over every registered kind against it).

A kind is a module (``resources/z9/resources/<type>/jobs/<verb>.py``) or an object with:

observe(ctx)               read the world (never trust the database's copy of it) → a world
plan(job, world)           pure: (intent, world) → the ordered steps still missing; [] = done
apply(ctx, world, step)    run one step, idempotently, waiting on its task's UPID
verify(ctx)                read back; what it returns is what ``record`` writes
record(conn, ctx, seen)    in the transaction that finishes the job: write what verify saw
record_failure(conn, ctx, error)   the resource carries a failed job's reason

``KIND`` is the ``jobs.kind`` value. ``RECORDS_NOTHING = True`` (optional): ``record`` writes
nothing, so the finish and the next claim may be one statement (batching.py).

The intent a kind converges to is the job's arguments merged over its row's (the resource type's
``intent`` hook decides what a re-run takes): every type reads it through ``ctx.job.args`` and
its row, the same for all.
"""
from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from z9.common.models import Job

from .context import JobContext, Step

PHASES = ("observe", "plan", "apply", "verify", "record", "record_failure")


@runtime_checkable
class JobKind(Protocol):
    """What the executor runs (:func:`z9.executor.runner.run_job`). Positional-only parameters:
    a kind names its own (``world``, ``server``…)."""

    KIND: str

    async def observe(self, ctx: JobContext, /) -> Any: ...

    def plan(self, job: Job, world: Any, /) -> list[Step]: ...

    async def apply(self, ctx: JobContext, world: Any, step: Step, /) -> None: ...

    async def verify(self, ctx: JobContext, /) -> Any: ...

    async def record(self, conn: Any, ctx: JobContext, observed: Any, /) -> None: ...

    async def record_failure(self, conn: Any, ctx: JobContext, error: dict[str, Any], /) -> None: ...
