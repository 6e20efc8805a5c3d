"""The scheduler: turns due retries into pending work and reclaims expired leases.

``run_once`` (what tests call) does, each in its own short transaction:

1. ``lease_reclaim_expired`` — running jobs whose lease expired (the worker died or stalled)
   go to ``retry`` due now; the attempt the dead worker spent still counts, so a job out of
   attempts goes to ``failed`` and its resource carries the reason. The update re-checks the
   row under its lock, so a job that finished in between is never overwritten.
2. ``job_retry_due`` — ``retry`` jobs whose ``run_after`` has come go to ``pending``, and each
   of their regions is NOTIFYed on ``z9_jobs``.
3. on the first pass and every ``prune_every`` passes after, ``job_prune_finished`` — terminal
   jobs older than the retention are deleted in batches (``SKIP LOCKED``: never blocks claims) —
   and ``idempotency_prune`` — Idempotency-Keys older than their retention —, ``console_session_prune``
   — the web console's sessions ended more than a day ago — and
   ``jobs_unblock_missed``, a safety net: a blocked job (migration 0010) that nothing blocks any
   more is made claimable (the triggers should leave none; a warning says when it did).

Metrics: reclaims, promotions and prunes are counted as they happen; ``run`` also recounts the
job table with index-only queries (:meth:`Scheduler.refresh_job_metrics`): the live statuses
(``pending``, ``running``, ``retry``) and ``z9_job_oldest_pending_age_seconds`` at most every
``job_metrics_interval_s`` seconds, the finished ones (most of the table: 0.2 s per million rows)
at most every ``job_metrics_finished_interval_s``.

The loop sleeps until the earliest ``run_after`` or ``scheduler_interval_s`` (the lease scan
period), whichever comes first, and wakes early on ``NOTIFY z9_scheduler`` (a job entered
``retry``). Several replicas may run: every statement uses ``SKIP LOCKED`` and guarded updates.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

import asyncpg

from z9.common import kinds, metrics, store
from z9 import resources
from z9.common.clock import SYSTEM, Clock
from z9.common.db import LOCK_WAIT_ERRORS, SCHEDULER_CHANNEL, TRANSIENT_DB_ERRORS, connect_listener, create_service_pool
from z9.common.errors import LockWaitTimeout
from z9.common.settings import Settings

log = logging.getLogger("z9.scheduler")


@dataclass
class PassCounts:
    """What one ``run_once`` did."""

    reclaimed: int = 0
    reclaimed_failed: int = 0
    promoted: int = 0
    pruned: int = 0
    unblocked: int = 0  # blocked jobs the safety net found free (jobs_unblock_missed): 0 normally


class Scheduler:
    """See the module docstring. ``run()`` until ``stop()``."""

    def __init__(self, settings: Settings, *, prune_every: int = 60, clock: Clock = SYSTEM):
        self.settings = settings
        self.clock = clock  # every decision's time (store queries get clock.db_now())
        self.prune_every = prune_every
        self.pool: asyncpg.Pool | None = None
        self._passes = 0
        self._wake = asyncio.Event()
        self._stopping = asyncio.Event()
        self._metrics_at = self._finished_metrics_at = float("-inf")  # clock.monotonic() of the last recounts
        self._kinds = sorted(kinds.all_kinds())  # the known job kinds: series pre-created for each
        self._age_regions: set[str] = set()  # regions given a z9_job_oldest_pending_age_seconds value
        metrics.init_scheduler(self._kinds, settings.regions)

    def stop(self) -> None:
        """Make :meth:`run` return after its current pass."""
        self._stopping.set()
        self._wake.set()

    async def run_once(self) -> PassCounts:
        """One pass (reclaim, promote, maybe prune) on ``self.pool``; returns what it did."""
        counts = PassCounts()
        async with self.pool.acquire() as conn:
            async with conn.transaction():
                rows = await store.lease_reclaim_expired(conn, now=self.clock.db_now())
                for r in rows:
                    counts.reclaimed += 1
                    metrics.LEASE_RECLAIMS.labels(r["kind"], r["region"]).inc()
                    log.warning("job %s: lease expired; now %s", r["id"], r["status"],
                                extra={"job_id": r["id"], "kind": r["kind"], "region": r["region"],
                                       "attempt": r["attempt"]})
                    if r["status"] == "failed":
                        counts.reclaimed_failed += 1
                        metrics.reclaim_failed(r["kind"], r["region"])
                        await resources.mark_failed_by_job(conn, r["resource_type"], r["resource_id"],
                                                           r["error"]["message"], kind=r["kind"])
                # A job reclaimed as failed frees the next job of its resource: wake the executors
                # now rather than at their next poll (one reclaimed as retry is notified when the
                # promotion below, or a later pass, makes it pending).
                await store.jobs_notify(conn, sorted({r["region"] for r in rows if r["status"] == "failed"}))
            async with conn.transaction():
                due = await store.job_retry_due(conn, now=self.clock.db_now())
                counts.promoted = len(due)
                for r in due:
                    metrics.JOB_PROMOTIONS.labels(r["region"]).inc()
                await store.jobs_notify(conn, sorted({r["region"] for r in due}))
            if self._passes % self.prune_every == 0:
                counts.pruned = await self._prune(conn)
                metrics.JOBS_PRUNED.inc(counts.pruned)
                missed = await store.jobs_unblock_missed(conn)
                counts.unblocked = len(missed)
                if missed:  # the triggers of migration 0010 should leave none: say so loudly
                    log.warning("%d blocked job(s) had nothing blocking them any more; made claimable: %s",
                                len(missed), ", ".join(r["id"] for r in missed[:10]))
            self._passes += 1
        return counts

    async def refresh_job_metrics(self, *, finished: bool = True) -> None:
        """Recount the job table into ``z9_jobs`` (by kind, region, status: the live statuses,
        and the finished ones too when ``finished``) and ``z9_job_oldest_pending_age_seconds``
        (configured regions, any region with pending jobs, and every region set before, so a
        region whose pending jobs are gone reads 0 instead of its last age), with index-only
        queries (``job_count_by_status``, ``job_oldest_pending_age``); and who is waiting —
        ``z9_tenant_jobs_pending`` / ``z9_tenant_oldest_pending_age_seconds``, the top
        ``tenant_metrics_top_n`` tenants of each region, the rest as ``_other``
        (``job_live_by_tenant``: one walk of the live jobs)."""
        statuses = metrics.JOB_STATUSES if finished else metrics.LIVE_JOB_STATUSES
        async with self.pool.acquire() as conn:
            rows = await store.job_count_by_status(conn, statuses)
            regions = sorted(set(self.settings.regions) | self._age_regions
                             | {r[1] for r in rows if r[2] == "pending"})
            ages = await store.job_oldest_pending_age(conn, regions, now=self.clock.db_now())
            by_tenant = await store.job_live_by_tenant(conn, now=self.clock.db_now())
        metrics.set_job_counts(rows, statuses, self._kinds, self.settings.regions)
        metrics.set_tenant_waits(by_tenant, self.settings.tenant_metrics_top_n)
        for region, age_s in ages.items():
            metrics.JOB_OLDEST_PENDING_AGE.labels(region).set(age_s)
        self._age_regions.update(ages)

    async def _maybe_refresh_job_metrics(self) -> None:
        now, s = self.clock.monotonic(), self.settings
        if now - self._metrics_at < s.job_metrics_interval_s:
            return
        finished = now - self._finished_metrics_at >= s.job_metrics_finished_interval_s
        self._metrics_at = now
        if finished:
            self._finished_metrics_at = now
        await self.refresh_job_metrics(finished=finished)

    async def _prune(self, conn: asyncpg.Connection, batch: int = 1000, max_batches: int = 20) -> int:
        """Delete finished jobs past the retention (batches of ``batch``, each its own short
        statement) and expired idempotency keys; returns the jobs deleted."""
        total = 0
        for _ in range(max_batches):
            n = await store.job_prune_finished(conn, self.settings.job_retention_s, batch, now=self.clock.db_now())
            total += n
            if n < batch:
                break
        await store.idempotency_prune(conn, self.settings.idempotency_retention_s, now=self.clock.db_now())
        await store.console_session_prune(conn, 86400, now=self.clock.db_now())
        return total

    async def run(self) -> None:
        """Pass after pass until :meth:`stop`, reconnecting to the database with backoff."""
        self.settings.require_database_url()
        delay = 0.5
        listen: asyncpg.Connection | None = None
        while not self._stopping.is_set():
            try:
                if self.pool is None:
                    self.pool = await create_service_pool(self.settings, min_size=1, max_size=2,
                                                          application_name="z9-scheduler")
                if listen is None or listen.is_closed():
                    listen = await connect_listener(self.settings, application_name="z9-scheduler-listen")
                    await listen.add_listener(SCHEDULER_CHANNEL, lambda *_: self._wake.set())
                self._wake.clear()
                await self.run_once()
                await self._maybe_refresh_job_metrics()
                next_in = await store.job_retry_next_in(self.pool, now=self.clock.db_now())
                delay = 0.5
            except TRANSIENT_DB_ERRORS as e:
                log.warning("database unreachable (%s); retrying in %.1fs", e, delay)
                if listen is not None:
                    listen.terminate()
                    listen = None
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10)
                continue
            except (LockWaitTimeout, *LOCK_WAIT_ERRORS) as e:
                # A pass waited longer than its lock_timeout on a row or key another transaction
                # holds (a frozen API process; reclaiming a job to 'failed' takes its resource's
                # key lock at commit): rolled back, nothing written. The next pass tries again;
                # the server's idle_in_transaction_session_timeout bounds how long that lasts.
                log.warning("scheduler pass gave up waiting on a lock (%s); retrying in %.1fs", e, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5)
                continue
            sleep = self.settings.scheduler_interval_s
            if next_in is not None:
                sleep = max(0.0, min(sleep, next_in))
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=sleep)
            except TimeoutError:
                pass
        if listen is not None:
            await listen.close()
        if self.pool is not None:
            await self.pool.close()
