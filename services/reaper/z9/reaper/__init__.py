"""The reaper: finalises expired deletion buffers (second phase of a two-phase delete).

``run_once`` moves every resource (of each type whose deletion is buffered, from the registry
``z9.resources``) whose ``delete_after`` has passed from ``deleting`` to ``destroying`` and
enqueues its type's final job, in one transaction per type (``SKIP LOCKED``, so several replicas
never enqueue twice), and NOTIFYs the regions concerned. A cancellation racing
the reaper is decided by the row lock: ``cancel-deletion`` only matches ``delete_after > now()``.
"""
from __future__ import annotations

import asyncio
import logging

import asyncpg

from z9.common import metrics, store
from z9 import resources
from z9.common.clock import SYSTEM, Clock
from z9.common.db import LOCK_WAIT_ERRORS, TRANSIENT_DB_ERRORS, create_service_pool
from z9.common.errors import LockWaitTimeout
from z9.common.logs import job_fields
from z9.common.settings import Settings
from z9.common.tracing import current_trace_context

from .drift import DriftChecker

log = logging.getLogger("z9.reaper")


class Reaper:
    """See the module docstring. ``run()`` until ``stop()``; scans every ``reaper_interval_s``."""

    def __init__(self, settings: Settings, *, clock: Clock = SYSTEM):
        self.settings = settings
        self.clock = clock  # what "expired" and "due" are decided at (store queries get clock.db_now())
        self.pool: asyncpg.Pool | None = None
        self._stopping = asyncio.Event()
        self.drift = DriftChecker(settings, clock=clock)  # periodic read-only plans (drift.py)
        metrics.init_reaper(settings.regions, [t.name for t in resources.types() if t.plan_of is not None])

    def stop(self) -> None:
        """Make :meth:`run` return after its current pass."""
        self._stopping.set()

    async def run_once(self, batch: int = 100) -> int:
        """Finalise up to ``batch`` expired buffers of each type; return how many."""
        total = 0
        for rtype in resources.buffered():
            async with self.pool.acquire() as conn, conn.transaction():
                reaped = await rtype.reap_expired(conn, batch, now=self.clock.db_now())
                jobs = await store.job_insert_many(conn, [
                    rtype.new_job(row, rtype.final_kind, max_attempts=self.settings.max_attempts,
                                  trace_context=trace_context or current_trace_context())
                    for row, trace_context in reaped
                ])
            job_of = {j.resource_id: j for j in jobs}
            for row, _ in reaped:
                job = job_of[row.id]
                metrics.DELETION_BUFFER_EXPIRIES.labels(row.region).inc()
                log.info("%s %s: deletion buffer expired; %s %s enqueued", rtype.name, row.id, job.kind, job.id,
                         extra=job_fields(job))
            total += len(reaped)
        await self.enqueue_periodic(batch)
        await self.check_drift()
        return total

    async def check_drift(self) -> int:
        """Plan a bounded number of resources read-only and record their drift (:mod:`z9.reaper.drift`);
        a failure of it (the database, a bug) is logged and leaves the reaping alone. Returns how many."""
        try:
            return await self.drift.run_once(self.pool)
        except Exception as e:  # a bug in a kind's observe must not stop deletion buffers from expiring
            if isinstance(e, (*TRANSIENT_DB_ERRORS, LockWaitTimeout, *LOCK_WAIT_ERRORS)):
                raise  # the database's trouble: the loop's own handling
            log.exception("drift check failed")
            return 0

    async def enqueue_periodic(self, batch: int = 100) -> int:
        """The periodic observe-only jobs (types with ``periodic`` in the registry, e.g. load
        balancer health): one per live row whose last observation is older than its interval
        and which has no live job. The reaper already scans on a timer with SKIP LOCKED (safe
        with replicas) over the registry; refreshing is the same shape of work, so no new
        service. Returns how many were enqueued."""
        n = 0
        for rtype in resources.periodic():
            interval = float(getattr(self.settings, rtype.periodic.interval_setting))
            async with self.pool.acquire() as conn, conn.transaction():
                due = await rtype.periodic_due(conn, interval, batch, now=self.clock.db_now())
                await store.job_insert_many(conn, [rtype.new_job(row, rtype.periodic.kind, max_attempts=1)
                                                   for row in due])
            n += len(due)
        return n

    async def run(self) -> None:
        """Scan until :meth:`stop`, reconnecting to the database with backoff."""
        self.settings.require_database_url()
        delay = 0.5
        while not self._stopping.is_set():
            try:
                if self.pool is None:
                    self.pool = await create_service_pool(self.settings, min_size=1, max_size=2,
                                                          application_name="z9-reaper")
                n = await self.run_once()
                delay = 0.5
                if n:
                    continue
            except TRANSIENT_DB_ERRORS as e:
                log.warning("database unreachable (%s); retrying in %.1fs", e, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10)
                continue
            except (LockWaitTimeout, *LOCK_WAIT_ERRORS) as e:
                # a pass waited longer than its lock_timeout (an insert of a final job waits for
                # the key lock of a transaction enqueuing a job on the same resource): rolled
                # back, retried at the next pass
                log.warning("reaper pass gave up waiting on a lock (%s); retrying in %.1fs", e, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5)
                continue
            try:
                await asyncio.wait_for(self._stopping.wait(), timeout=self.settings.reaper_interval_s)
            except TimeoutError:
                pass
        self.drift.close()
        if self.pool is not None:
            await self.pool.close()
