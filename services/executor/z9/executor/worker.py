"""The executor process: LISTEN for work, claim under a lease, run jobs, heartbeat, stop cleanly.

- Wakeups: ``LISTEN z9_jobs`` on a dedicated connection (payload = region) plus a slow poll
  every ``poll_interval_s``. A dropped LISTEN connection is re-established with backoff and
  followed at once by a catch-up claim.
- Claims take at most the free capacity (``executor_concurrency`` − in flight), with
  ``FOR UPDATE SKIP LOCKED``; at most the earliest live job of a resource is claimable. Tenants
  take turns (round-robin), each tenant's jobs oldest first, each tenant under its cap on running
  jobs per region (``tenant_max_running_jobs``, or its own; docs/architecture.md). A region
  with ``max_concurrent_jobs`` is claimed under its cap across all executors (``store.job_claim``);
  a claim the cap held back is counted (``z9_region_cap_waits_total``) and logged at most once a
  minute per region.
- One heartbeat loop renews the lease of every job in flight that made progress within
  ``step_timeout_s``; a stalled job is cancelled and left to lease expiry; a lost lease cancels
  that job's task at once. Job code also makes a fenced write right before every mutating
  hypervisor call (``JobContext.fence``), so a worker that lost its lease sends nothing more.
- SIGTERM (``stop()``): claim nothing more, let running jobs end for ``shutdown_grace_s``
  seconds, then cancel the rest and hand them over (``retry`` due now, attempt refunded).
"""
from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
from typing import Any, Callable, Coroutine

import asyncpg

from z9.common import metrics, store, tracing
from z9.common.clock import SYSTEM, Clock
from z9.common.db import JOBS_CHANNEL, TRANSIENT_DB_ERRORS, connect_listener, create_service_pool, server_label
from z9.common.errors import LockWaitTimeout
from z9.common.logs import bind_job, job_fields
from z9.common.models import Job
from z9.common.settings import Settings

from .batching import FinishBatcher
from .context import JobContext
from .jobs import REGISTRY, UnknownKind
from .proxmox import ProxmoxClient
from .runner import hand_over, run_job

log = logging.getLogger("z9.executor")


def run_event_loop(main: Coroutine[Any, Any, Any]) -> Any:
    """Run ``main`` (the executor process's top coroutine) on uvloop's event loop (libuv) rather
    than asyncio's own: the executor's work per job is mostly event-loop turns and asyncpg I/O, and
    uvloop does them in C — executor CPU per no-op job at concurrency 1 about 270 → 210 µs,
    at 4 about 100 → 80 µs (bench/README.md, "Lean at C = 1 and C = 4"). Same asyncio API: tasks,
    signal handlers (``z9.common.shutdown``), threads for the Proxmox client, asyncpg."""
    import uvloop

    return uvloop.run(main)


def worker_identity() -> str:
    """``host:pid:random`` — unique per process even when two hosts share a name."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


class Executor:
    """Claims and runs the jobs of ``regions``. ``run()`` until ``stop()``.

    ``client_factory(region) -> ProxmoxClient`` may be replaced (tests). ``clock``: the time every
    decision reads (leases, step timeouts, snoozes; :mod:`z9.common.clock`).
    """

    def __init__(self, settings: Settings, regions: list[str], *, owner: str | None = None,
                 client_factory: Callable[[str], ProxmoxClient] | None = None, clock: Clock = SYSTEM):
        missing = [r for r in regions if r not in settings.regions]
        if not regions:
            raise ValueError("an executor needs at least one region (--region)")
        if missing and client_factory is None:
            raise ValueError(f"region(s) {', '.join(missing)} not configured in Z9_REGIONS")
        self.settings = settings
        self.clock = clock
        self.regions = list(regions)
        self.owner = owner or worker_identity()
        factory = client_factory or (lambda r: ProxmoxClient(r, settings.regions[r]))
        self.clients = {r: factory(r) for r in self.regions}
        metrics.init_executor(REGISTRY, self.regions)
        # region → max_concurrent_jobs, for the capped regions only (none: the plain claim)
        self.caps: dict[str, int] = {r: c for r in self.regions if r in settings.regions
                                     and (c := settings.regions[r].max_concurrent_jobs) is not None}
        metrics.init_region_caps(self.caps)
        self._cap_logged: dict[str, tuple[float, int]] = {}  # region → (last log line, waits since)
        self.pool: asyncpg.Pool | None = None
        self.finisher: FinishBatcher | None = None  # success finishes share transactions
        self.inflight: dict[str, tuple[asyncio.Task, JobContext]] = {}
        self.listen_healthy = False  # True while the LISTEN connection is established
        self._claim_turn = 0  # rotates the region a claim asks first (see _claim_order)
        self._reserved = 0  # slots promised to claims in flight (so two claims never overfill)
        self._wake = asyncio.Event()
        self._stopping = asyncio.Event()
        self._dsn = settings.require_database_url()

    # ---------------------------------------------------------------- lifecycle

    def stop(self) -> None:
        """Stop claiming; ``run()`` then drains and returns."""
        self._stopping.set()
        self._wake.set()

    async def run(self) -> None:
        """Serve until :meth:`stop`; then drain (see the module docstring). Retries the database
        connection with backoff at start. Runs in :func:`tracing.quiet_context` (claims, heartbeats
        and LISTEN checks are no request's: not traced); each job's task sets up its own trace."""
        await asyncio.get_running_loop().create_task(self._serve(), name="z9-executor",
                                                     context=tracing.quiet_context())

    async def _serve(self) -> None:
        try:
            pool = await self._connect_pool(self.settings.executor_concurrency + 4)
            if pool is None:  # stopped before the database could be reached: nothing to drain
                log.info("executor %s stopped before it reached the database", self.owner)
                return
            self.pool = pool
            await self._claim_loop()
        finally:  # however it ends (a stop, cancelled while connecting): the clients' threads
            for c in self.clients.values():
                c.close()

    async def _claim_loop(self) -> None:
        """Claim and run until :meth:`stop`, then drain and close the pool."""
        assert self.pool is not None
        # the one-statement finish + claim cannot take a region's cap lock and count its running
        # jobs (store.job_claim does): an executor serving a capped region claims the usual way.
        # Nor does it take a time (the function of migration 0012 reads the server's now()): under
        # a test clock, finishes and claims are two statements, both at the clock's time.
        one_statement = not self.caps and self.clock.db_now() is None
        self.finisher = FinishBatcher(self.pool, claim_next=self._claim_in_finish, on_claimed=self._claimed,
                                      claim_one=self._claim_in_finish_statement if one_statement else None)
        listener = asyncio.create_task(self._listen_loop(), name="z9-listen")
        heartbeat = asyncio.create_task(self._heartbeat_loop(), name="z9-heartbeat")
        log.info("executor %s serving regions %s (concurrency %d)", self.owner, ",".join(self.regions),
                 self.settings.executor_concurrency)
        try:
            while not self._stopping.is_set():
                self._wake.clear()  # a NOTIFY or a finished job during the claim sets it again
                await self._claim_once()
                try:
                    await asyncio.wait_for(self._wake.wait(), timeout=self.settings.poll_interval_s)
                except TimeoutError:
                    pass
        finally:
            await self._drain()
            listener.cancel()
            heartbeat.cancel()
            await asyncio.gather(listener, heartbeat, return_exceptions=True)
            await self.pool.close()
            log.info("executor %s stopped", self.owner)

    async def _connect_pool(self, size: int) -> asyncpg.Pool | None:
        """The pool, once the database answers (retried with backoff); None when :meth:`stop`
        came first."""
        delay = 0.5
        while not self._stopping.is_set():
            try:
                return await create_service_pool(self.settings, min_size=1, max_size=size,
                                                 application_name="z9-executor")
            except TRANSIENT_DB_ERRORS as e:
                if self._stopping.is_set():
                    break
                log.warning("database unreachable (%s); retrying in %.1fs", e, delay)
                try:  # a stop ends the wait at once
                    await asyncio.wait_for(self._stopping.wait(), timeout=delay)
                except TimeoutError:
                    pass
                delay = min(delay * 2, 10)
        return None

    # ---------------------------------------------------------------- claiming

    async def _claim_once(self) -> None:
        """Claim up to the free capacity. When capacity is full, the next finished job wakes the
        loop; when there was less work than capacity, the next NOTIFY or poll does."""
        free = self.settings.executor_concurrency - len(self.inflight) - self._reserved
        if free <= 0:
            return
        self._reserved += free
        jobs: list[Job] = []
        try:
            jobs = await store.job_claim(self.pool, self._claim_order(), free, self.owner, self.settings.lease_ttl_s,
                                         self.caps, self._cap_held, now=self.clock.db_now(),
                                         tenant_cap=self.settings.tenant_max_running_jobs)
        except (*TRANSIENT_DB_ERRORS, LockWaitTimeout) as e:  # a lock wait: a capped region's lock
            log.warning("claim failed (%s); retrying after a pause", e)
            await asyncio.sleep(1.0)
        finally:
            self._claimed(free, jobs)

    def _claim_order(self) -> list[str]:
        """This executor's regions in the order the next claim asks them, rotated by one on every
        claim: :func:`store.job_claim` fills the free slots region by region, so a fixed order
        would let a region that always has work starve the others."""
        i = self._claim_turn % len(self.regions)
        self._claim_turn += 1
        return self.regions[i:] + self.regions[:i]

    async def _claim_in_finish(self, conn: asyncpg.Connection, freed: int) -> tuple[int, list[Job]]:
        """Inside the transaction finishing ``freed`` jobs: claim for the slots they free (and
        any other free ones). Returns (slots reserved, jobs); :meth:`_claimed` runs after commit."""
        if self._stopping.is_set():
            return 0, []
        free = self.settings.executor_concurrency - len(self.inflight) - self._reserved + freed
        if free <= 0:
            return 0, []
        self._reserved += free
        try:
            return free, await store.job_claim(conn, self._claim_order(), free, self.owner,
                                               self.settings.lease_ttl_s, self.caps, self._cap_held,
                                               now=self.clock.db_now(),
                                               tenant_cap=self.settings.tenant_max_running_jobs)
        except BaseException:
            self._reserved -= free
            raise

    def _cap_held(self, region: str, cap: int, running: int) -> None:
        """The region's cap held a claim back while its jobs waited: count it, and say so at
        most once a minute per region (with how often it happened since)."""
        metrics.region_cap_held(region)
        now = self.clock.monotonic()
        last, waits = self._cap_logged.get(region, (float("-inf"), 0))
        if now - last < 60.0:
            self._cap_logged[region] = (last, waits + 1)
            return
        self._cap_logged[region] = (now, 0)
        log.info("region %s is at its cap of %d concurrent jobs (%d running across all executors): "
                 "claimable jobs wait for a slot (%d more held-back claims in the last minute; "
                 "max_concurrent_jobs in Z9_REGIONS)", region, cap, running, waits)

    def _claim_in_finish_statement(self, freed: int) -> tuple[int, str | None, str, float, int | None]:
        """For a finish and claim in one statement (batching.py): reserve the slots the ``freed``
        jobs and any other free ones leave, in the region this claim asks (one region per
        statement; the next claim asks the next one first). Returns (slots reserved, region or
        None, lease owner, lease TTL, tenant cap); :meth:`_claimed` runs after commit."""
        s = self.settings
        free = s.executor_concurrency - len(self.inflight) - self._reserved + freed
        if self._stopping.is_set() or free <= 0:
            return 0, None, self.owner, s.lease_ttl_s, s.tenant_max_running_jobs
        self._reserved += free
        region = self.regions[self._claim_turn % len(self.regions)]  # _claim_order()[0], without the list
        self._claim_turn += 1
        return free, region, self.owner, s.lease_ttl_s, s.tenant_max_running_jobs

    def _claimed(self, reserved: int, jobs: list[Job]) -> None:
        """Release ``reserved`` slots and start ``jobs`` (claimed, and committed)."""
        self._reserved -= reserved
        for job in jobs:
            self._spawn(job)

    def _spawn(self, job: Job) -> None:
        ctx = JobContext(job, self.owner, self.pool, self.clients[job.region], self.settings,
                         finisher=self.finisher, clock=self.clock)
        metrics.job_claimed(job)
        task = asyncio.create_task(self._run(ctx), name=f"job-{job.id}")
        self.inflight[job.id] = (task, ctx)

    async def _run(self, ctx: JobContext) -> None:
        job = ctx.job
        bind_job(job)  # every log line of this task carries the job's fields
        try:
            kind = REGISTRY.get(job.kind) or UnknownKind(job.kind)
            # the attempt's span (deferred until it has something to do: tracing.job_span)
            with tracing.job_span(job, self.settings.trace_uneventful_ratio) as span:
                span.set_attribute("job.outcome", await run_job(ctx, kind))
        except asyncio.CancelledError:
            if not self._stopping.is_set():  # stalled or lease lost; on shutdown _drain counts it
                metrics.attempt_ended(job, "lease_lost", "lease_lost", ctx.claimed_at)
        except TRANSIENT_DB_ERRORS as e:
            metrics.attempt_ended(job, "lease_lost", "temporary", ctx.claimed_at)
            log.warning("job %s: database lost (%s); the lease will expire and the "
                        "scheduler will hand it on", job.id, e)
        except Exception:
            metrics.attempt_ended(job, "lease_lost", "internal", ctx.claimed_at)
            log.exception("job %s: executor error", job.id)
        finally:
            metrics.job_released(job)
            # Only our own entry: after a reclaim this executor may already run the next attempt.
            entry = self.inflight.get(job.id)
            if entry is not None and entry[1] is ctx:
                del self.inflight[job.id]
            # A slot is free: the claim loop fills it. Not when the finish already claimed this
            # job's successor (batching.py: at concurrency 1, nearly every job) — the loop would
            # wake to find no free slot (``_claim_once``), a task and a timer per job for nothing.
            if len(self.inflight) < self.settings.executor_concurrency:
                self._wake.set()

    # ---------------------------------------------------------------- LISTEN

    def _on_notify(self, _conn: Any, _pid: int, _channel: str, payload: str) -> None:
        if payload in self.regions or payload == "":
            self._wake.set()

    async def _listen_loop(self) -> None:
        delay = 0.2
        established = False  # a LISTEN connection was up before (for the reconnect counter)
        while not self._stopping.is_set():
            conn = None
            try:
                conn = await connect_listener(self.settings, application_name="z9-executor-listen")
                lost = asyncio.Event()
                conn.add_termination_listener(lambda _c: lost.set())
                await conn.add_listener(JOBS_CHANNEL, self._on_notify)
                self.listen_healthy = True
                metrics.listen_up(reconnected=established)
                established = True
                log.info("LISTEN %s established on %s", JOBS_CHANNEL, server_label(conn))
                self._wake.set()  # catch up on anything missed while not listening
                delay = 0.2
                while not lost.is_set():
                    try:
                        await asyncio.wait_for(lost.wait(), timeout=self.settings.poll_interval_s)
                    except TimeoutError:
                        await conn.fetchval("SELECT 1", timeout=5)
                log.warning("LISTEN connection lost; re-establishing")
            except asyncio.CancelledError:
                raise
            except Exception as e:  # TRANSIENT_DB_ERRORS and protocol errors alike
                log.warning("LISTEN connection failed (%s); retrying in %.1fs", e, delay)
            finally:
                self.listen_healthy = False
                metrics.listen_down()
                if conn is not None:
                    conn.terminate()
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)

    # ---------------------------------------------------------------- heartbeat

    async def _heartbeat_loop(self) -> None:
        s = self.settings
        while True:
            await self.clock.sleep(s.heartbeat_s)
            try:
                await self._heartbeat_once()
            except TRANSIENT_DB_ERRORS as e:
                log.warning("heartbeat failed (%s)", e)
            except Exception:  # never let the heartbeat loop die: leases would expire
                log.exception("heartbeat error")

    async def _heartbeat_once(self) -> None:
        """Renew, in one statement, the lease of every job in flight that made progress within
        ``step_timeout_s``; cancel the stalled ones and those whose lease is lost."""
        s = self.settings
        now = self.clock.monotonic()
        renew: list[tuple[str, asyncio.Task, JobContext]] = []
        for job_id, (task, ctx) in list(self.inflight.items()):
            if task.done():
                continue
            if ctx.finished:
                if ctx.flushing:  # done, its finish retried after a lock wait: keep the lease
                    renew.append((job_id, task, ctx))
                continue
            if now - ctx.last_progress > s.step_timeout_s:
                # Stalled: give it up (no hand-over). Its lease expires and the scheduler hands
                # the job on; the task is cancelled so it can act on nothing any more.
                log.warning("job %s: no progress for %.0fs; giving it up, its lease will expire",
                            job_id, now - ctx.last_progress, extra=job_fields(ctx.job))
                ctx.finished = True
                task.cancel()
                continue
            renew.append((job_id, task, ctx))
        if not renew:
            return
        lost_leases, renewed_leases = await store.job_renew_leases(
            self.pool, [ctx.lease for _, _, ctx in renew], s.lease_ttl_s, now=self.clock.db_now())
        lost = {(l.job_id, l.attempt) for l in lost_leases}
        extended = {(l.job_id, l.attempt) for l in renewed_leases}
        for job_id, task, ctx in renew:
            if (ctx.lease.job_id, ctx.lease.attempt) not in lost:
                if (ctx.lease.job_id, ctx.lease.attempt) in extended:  # (a skipped row was not)
                    ctx.deadline.renewed(now)  # (read before the renewal was sent)
                continue
            if ctx.finished:  # it finished while we were renewing: nothing was lost
                continue
            log.warning("job %s: lease of %s (attempt %d) is lost; cancelling it", job_id, ctx.lease.owner,
                        ctx.lease.attempt, extra=job_fields(ctx.job))
            task.cancel()

    # ---------------------------------------------------------------- shutdown

    async def _drain(self) -> None:
        if not self.inflight:
            return
        grace = self.settings.shutdown_grace_s
        log.info("stopping: waiting up to %.0fs for %d running job(s)", grace, len(self.inflight))
        tasks = [t for t, _ in self.inflight.values()]
        await asyncio.wait(tasks, timeout=grace)
        left = list(self.inflight.values())
        for task, _ in left:
            task.cancel()
        await asyncio.gather(*(t for t, _ in left), return_exceptions=True)
        for _, ctx in left:
            try:
                if await hand_over(ctx, f"handed over: executor {self.owner} is shutting down"):
                    metrics.attempt_ended(ctx.job, "handed_over", "none", ctx.claimed_at)
                    log.info("job %s handed over", ctx.job.id, extra=job_fields(ctx.job))
                else:
                    metrics.attempt_ended(ctx.job, "lease_lost", "lease_lost", ctx.claimed_at)
            except (*TRANSIENT_DB_ERRORS, LockWaitTimeout) as e:  # unreachable, or its row held past lock_timeout
                metrics.attempt_ended(ctx.job, "lease_lost", "temporary", ctx.claimed_at)
                log.warning("job %s: could not hand over (%s); its lease will expire", ctx.job.id, e,
                            extra=job_fields(ctx.job))
