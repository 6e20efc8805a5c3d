"""Group commit for job finishes: the success writes of concurrent jobs share one transaction.

A job that succeeded calls :meth:`FinishBatcher.succeed` (through ``JobContext.succeed``). The
first caller starts a flush at once; while that flush's transaction is in flight (one WAL
flush, a millisecond or so), later callers queue up and go together in the next one. So there
is no added wait when the executor is quiet, and under load N finishes cost one commit.

One flush, in one transaction:

1. ``job_succeed_many``: one UPDATE over ``unnest`` arrays, fenced row by row by
   ``(id, lease_owner, attempt, status = 'running')`` exactly like the single ``job_succeed``;
2. each kind's ``record(conn, ctx, observed)`` for the jobs whose row matched, in the same
   transaction (as on the single path);
3. optionally (``claim_next``), the executor's next claim, for the slots these finishes free
   (after ``jobs_unblock_now`` when a finished job had a resource: the jobs waiting on it become
   claimable in this transaction, not only at its commit):
   one commit — one WAL flush — then both ends the old jobs and leases the new ones, instead
   of one for each (at concurrency 1 that halves the flushes per job);
4. commit. Then each waiting job gets its own answer: done, or :class:`LeaseLost` when its row
   did not match (that job is reported lost and writes nothing more; the others succeed), and
   the claimed jobs go to ``on_claimed``.

When every kind of a batch of at most ``ONE_STATEMENT_MAX_BATCH`` jobs records nothing (the kind
module says ``RECORDS_NOTHING = True``) and the executor gave ``claim_one``, steps 1–4 are one
statement instead (``job_finish_and_claim``:
one round trip and one commit where the transaction takes four — BEGIN, finish, claim, COMMIT),
with the same fencing, the same answers and the same fallbacks. A kind whose ``record`` writes
(every product kind today) keeps the transaction: its writes are Python between the fenced finish
and the claim.

If anything else goes wrong in the shared transaction (a ``record`` raising, a deadlock with
the scheduler's reclaim), it rolls back and every job of the batch is finished again on its
own, through the single path, so each gets exactly the outcome it would have had alone. A
lost database connection is raised to every job of the batch (the leases then expire and the
scheduler hands the jobs on, as on the single path).

No stuck transaction stalls the others. A finish waiting on a row another transaction holds (an
API process frozen inside a DELETE that locked the resource row its ``record`` updates) gives up
after the connection's ``lock_timeout`` (``Z9_EXECUTOR_DB_LOCK_TIMEOUT_S``); the batch rolls back
and its jobs are finished one by one, *concurrently and outside the batcher's loop*: the others
commit at once, later finishes and the claims go on, and the blocked one is retried on its own
with backoff until it commits or its lease is lost — marked ``flushing`` meanwhile, so the
executor's heartbeat keeps renewing its lease (a finished but unrecorded job is still running).
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Awaitable, Callable

import asyncpg

from z9.common import store, tracing
from z9.common.db import LOCK_WAIT_ERRORS, TRANSIENT_DB_ERRORS, is_stale_statement
from z9.common.errors import LeaseLost, LockWaitTimeout

if TYPE_CHECKING:  # the context imports this module
    from .kind import JobKind

log = logging.getLogger("z9.executor")

BLOCKED_ERRORS: tuple[type[BaseException], ...] = (LockWaitTimeout, *LOCK_WAIT_ERRORS)
"""A finish that gave up waiting on a lock (or lost a deadlock): rolled back, retried alone."""
RETRY_FIRST_S = 0.2  # pause before a blocked finish's next try, doubled up to RETRY_CAP_S
RETRY_CAP_S = 5.0
ONE_STATEMENT_MAX_BATCH = 4
"""Largest batch finished by the one-statement path: it claims one job at a time (a generic plan
must not carry a variable LIMIT), so a larger batch costs PostgreSQL more CPU there than the
transaction's one claim of k rows, while the transaction's four round trips are shared by k jobs
(bench/README.md, issue 14: server CPU per job ×1.1–1.6 at concurrency 16)."""


@dataclass
class _Finish:
    ctx: Any  # JobContext
    kind: JobKind
    observed: Any
    future: "asyncio.Future[None]"


async def succeed_one(pool: asyncpg.Pool, ctx: Any, kind: JobKind, observed: Any) -> None:
    """The single path: fenced ``job_succeed`` and the kind's ``record`` in one transaction.
    Raises LeaseLost, the database's errors, or whatever ``record`` raises (rolled back)."""
    async with pool.acquire() as conn, conn.transaction():
        await store.job_succeed(conn, ctx.lease, ctx.steps_json())
        await kind.record(conn, ctx, observed)


class FinishBatcher:
    """Coalesces the success finishes of one executor's jobs (see the module docstring).
    ``max_batch``: most jobs per transaction. ``claim_next(conn, freed) -> (reserved, jobs)``
    claims inside the finish transaction (``freed``: jobs this commit ends); after commit
    ``on_claimed(reserved, jobs)`` gets the jobs — or ``[]`` when the transaction rolled back."""

    def __init__(self, pool: asyncpg.Pool, *, max_batch: int = 256,
                 claim_next: Callable[[Any, int], Awaitable[tuple[int, list[Any]]]] | None = None,
                 on_claimed: Callable[[int, list[Any]], None] | None = None,
                 claim_one: Callable[[int], tuple[int, str | None, str, float, int | None]] | None = None):
        self.pool = pool
        self.max_batch = max_batch
        self.claim_next = claim_next
        self.on_claimed = on_claimed
        # claim_one(freed) -> (slots reserved, region or None, lease owner, lease TTL, tenant cap): the claim of
        # the one-statement path (module docstring); its reservation is released by on_claimed.
        self.claim_one = claim_one
        self.one_statement_flushes = 0  # flushes that took the one-statement path (tests, benchmarks)
        self._queue: list[_Finish] = []
        self._task: asyncio.Task[None] | None = None
        self._alone_tasks: set[asyncio.Task[None]] = set()  # finishes retried on their own
        self.flushes = 0  # transactions run (tests, benchmarks)
        self.blocked_retries = 0  # finishes that gave up on a lock and were tried again (tests)

    async def succeed(self, ctx: Any, kind: JobKind, observed: Any) -> None:
        """Finish ``ctx.job`` as succeeded (recording ``observed`` through ``kind.record``),
        together with whatever other finishes are waiting. Raises LeaseLost when this job's
        row no longer matches its lease, the database's connection errors, or what ``record``
        raised."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.append(_Finish(ctx, kind, observed, fut))
        if self._task is None or self._task.done():
            # not in this job's context: the task outlives it and finishes other jobs' batches
            self._task = asyncio.get_running_loop().create_task(self._run(), name="z9-finish-batch",
                                                                context=tracing.quiet_context())
        await fut

    async def _run(self) -> None:
        while self._queue:
            batch, self._queue = self._queue[: self.max_batch], self._queue[self.max_batch:]
            try:
                await self._flush(batch)
            except BaseException as e:  # never leave a job waiting forever
                for f in batch:
                    _resolve(f, e if isinstance(e, Exception) else RuntimeError(repr(e)))
                if not isinstance(e, Exception):
                    raise

    async def _flush(self, batch: list[_Finish]) -> None:
        self.flushes += 1
        claimed: tuple[int, list[Any]] = (0, [])
        try:
            for stale_plans_left in (1, 0):
                try:
                    if (self.claim_one is not None and len(batch) <= ONE_STATEMENT_MAX_BATCH
                            and all(getattr(f.kind, "RECORDS_NOTHING", False) for f in batch)):
                        lost_ids, claimed = await self._finish_and_claim(batch)
                    else:
                        lost_ids, claimed = await self._finish_in_transaction(batch)
                    break
                except TRANSIENT_DB_ERRORS as e:
                    # A migration retyped what a cached statement returns: refused before it ran,
                    # rolled back, the pool's statement cache dropped — run the batch again now
                    # rather than leave its jobs to their leases' expiry.
                    if not stale_plans_left or not is_stale_statement(e):
                        raise
                    log.info("finish of %d job(s) met a statement the schema changed under (%s); again",
                             len(batch), e)
        except TRANSIENT_DB_ERRORS as e:
            for f in batch:
                _resolve(f, e)
            return
        except Exception as e:
            blocked = isinstance(e, BLOCKED_ERRORS)
            if len(batch) == 1 and not blocked:  # its row did not match (LeaseLost), or its record failed
                _resolve(batch[0], e)
                return
            # A record() failing (even with LeaseLost: the fenced batch update reports lost rows by
            # value, so which job it concerns is unknown), a lock wait given up, a deadlock: each
            # job on its own instead — concurrently and not awaited here, so one still-blocked job
            # holds up neither the others nor the next batches.
            (log.warning if blocked else log.debug)(
                "finish of %d job(s) rolled back (%s); finishing them one by one", len(batch), e)
            for f in batch:
                self._spawn_alone(f, retry_blocked=True, first_blocked=blocked and len(batch) == 1)
            return
        for f in batch:
            if (f.ctx.lease.job_id, f.ctx.lease.attempt) in lost_ids:
                l = f.ctx.lease
                _resolve(f, LeaseLost(f"job {l.job_id}: lease of {l.owner} (attempt {l.attempt}) is lost"))
            else:
                _resolve(f)
        if self.on_claimed is not None and claimed[0]:
            self.on_claimed(*claimed)

    async def _finish_in_transaction(self, batch: list[_Finish]) -> tuple[set[tuple[str, int]], tuple[int, list[Any]]]:
        """Fenced finish of ``batch``, each won job's ``record``, and the next claim, in one
        transaction. Returns (the (id, attempt) of the lost leases, (slots reserved, jobs claimed))."""
        claimed: tuple[int, list[Any]] = (0, [])
        try:
            async with self.pool.acquire() as conn, conn.transaction():
                if len(batch) == 1:
                    await store.job_succeed(conn, batch[0].ctx.lease, batch[0].ctx.steps_json())
                    lost_ids: set[tuple[str, int]] = set()
                else:
                    lost = await store.job_succeed_many(conn, [(f.ctx.lease, f.ctx.steps_json()) for f in batch])
                    lost_ids = {(l.job_id, l.attempt) for l in lost}
                won = [f for f in batch if (f.ctx.lease.job_id, f.ctx.lease.attempt) not in lost_ids]
                for f in won:
                    await f.kind.record(conn, f.ctx, f.observed)
                if self.claim_next is not None and won:
                    if any(f.ctx.job.resource_id for f in won):  # their waiters, claimable now
                        await store.jobs_unblock_now(conn)
                    claimed = await self.claim_next(conn, len(won))
        except BaseException:
            if claimed[0] and self.on_claimed is not None:
                self.on_claimed(claimed[0], [])  # rolled back: those claims never happened
            raise
        return lost_ids, claimed

    async def _finish_and_claim(self, batch: list[_Finish]) -> tuple[set[tuple[str, int]], tuple[int, list[Any]]]:
        """The one-statement path: fenced finish of ``batch`` and the next claim, one commit.
        Returns (the (id, attempt) of the lost leases, (slots reserved, jobs claimed))."""
        assert self.claim_one is not None
        reserved, region, owner, ttl, tenant_cap = self.claim_one(len(batch))
        try:
            async with self.pool.acquire() as conn:
                lost, jobs = await store.job_finish_and_claim(
                    conn, [(f.ctx.lease, f.ctx.steps_json()) for f in batch], region, reserved, owner, ttl,
                    tenant_cap)
        except BaseException:
            if reserved and self.on_claimed is not None:
                self.on_claimed(reserved, [])  # nothing committed: those claims never happened
            raise
        self.one_statement_flushes += 1
        return {(l.job_id, l.attempt) for l in lost}, (reserved, jobs)

    def _spawn_alone(self, f: _Finish, *, retry_blocked: bool, first_blocked: bool = False) -> None:
        task = asyncio.get_running_loop().create_task(self._alone(f, retry_blocked, first_blocked),
                                                      name=f"z9-finish-{f.ctx.job.id}")
        self._alone_tasks.add(task)
        task.add_done_callback(self._alone_tasks.discard)

    async def _alone(self, f: _Finish, retry_blocked: bool = False, first_blocked: bool = False) -> None:
        """Finish one job on the single path; with ``retry_blocked``, a try that gave up on a lock
        is repeated with backoff (the job marked ``flushing``: its lease stays renewed) until it
        commits, its lease is lost, or its waiter is gone."""
        delay = RETRY_FIRST_S
        if first_blocked:  # the batch of one just gave up on this lock: pause before trying again
            f.ctx.flushing = True
            self.blocked_retries += 1
            await asyncio.sleep(delay)
        while True:
            try:
                await succeed_one(self.pool, f.ctx, f.kind, f.observed)
            except BLOCKED_ERRORS as e:
                if not retry_blocked or f.future.done():
                    _resolve(f, e)
                    return
                f.ctx.flushing = True
                self.blocked_retries += 1
                log.warning("job %s: finishing it waited too long on a lock (%s); retrying in %.1fs",
                            f.ctx.job.id, e, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_CAP_S)
                continue
            except Exception as e:
                _resolve(f, e)
            else:
                _resolve(f)
            finally:
                if f.future.done():
                    f.ctx.flushing = False
            return


def _resolve(f: _Finish, exc: BaseException | None = None) -> None:
    """Answer the waiting job (unless it was cancelled meanwhile)."""
    if f.future.done():
        return
    if exc is None:
        f.future.set_result(None)
    else:
        f.future.set_exception(exc)
