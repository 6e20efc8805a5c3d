"""Runs one claimed job through observe → plan → apply → verify and writes its outcome.

Outcomes (architecture §2, §4):

- plan empty, or every step applied and verify reads the world back as intended →
  ``succeeded``; the kind's ``record`` writes the observed state in the same transaction.
- :class:`Snooze` (a VM lock held by another task) → ``retry`` after the snooze delay, the
  attempt given back — until ``snooze_limit_s`` seconds have passed since the job's first
  snooze (kept in its memo); past that, a snooze counts as a temporary error.
- :class:`TemporaryError` (or any unexpected exception) → ``retry`` with exponential backoff;
  the resource keeps its status. Out of attempts → ``failed`` and the resource carries it. An
  attempt that got a step done is given back (bounded, ``progress_refunds`` in the memo).
- the job's row locked by another session past ``lock_timeout`` → waited for, then ``retry``
  with the attempt given back (a warning, no traceback).
- :class:`PermanentError` → ``failed`` at once; the resource carries the reason.
- :class:`LeaseLost` → the job belongs to another worker now: stop and write nothing.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from z9.common import metrics, store, tracing
from z9.common.backoff import backoff_delay_s
from z9.common.db import LOCK_WAIT_ERRORS, TRANSIENT_DB_ERRORS
from z9.common.errors import (Cancelled, GuardRefusal, InternalError, JobError, LeaseLost, LockWaitTimeout,
                              PermanentError, Snooze, TemporaryError)
from z9.common.logs import job_fields
from z9.common.models import utc_now_iso

from . import lease_deadline
from .context import JobContext
from .kind import JobKind

#: a write of the job's row gave up waiting for a lock another session holds
ROW_LOCKED: tuple[type[BaseException], ...] = (LockWaitTimeout, *LOCK_WAIT_ERRORS)

log = logging.getLogger("z9.executor")


def _error(exc: BaseException, cls: str | None = None) -> dict[str, Any]:
    """The job row's ``error``: ``{class, message, at}``, plus ``task_log`` (the failed
    hypervisor task's last log lines) when there is one."""
    err = {"class": cls or getattr(exc, "error_class", "temporary"), "message": str(exc) or repr(exc),
           "at": utc_now_iso()}
    tail = getattr(exc, "log_tail", None)
    if tail:
        err["task_log"] = tail[-10:]
    if isinstance(exc, GuardRefusal):
        err["refused"] = True
    if isinstance(exc, Cancelled):
        err["by_job"] = exc.by_job
    return err


async def run_job(ctx: JobContext, kind: JobKind) -> str:
    """Run ``ctx.job`` with job-kind module ``kind``; return the outcome
    (succeeded | retry | snoozed | failed | lost). Raises CancelledError when cancelled (the
    caller hands the job over or has lost its lease) and the database's connection errors
    (``TRANSIENT_DB_ERRORS``: the lease then expires and the scheduler hands the job on)."""
    job = ctx.job
    extra = job_fields(job)
    lease_deadline.bind(ctx.deadline)  # this task's Proxmox calls stop at the lease's local deadline
    try:
        try:
            await ctx.check_superseded()
            with metrics.phase(job, "observe"), tracing.span("observe", {"z9.phase": "observe"}):
                world = await kind.observe(ctx)
            with metrics.phase(job, "plan"), tracing.span("plan", {"z9.phase": "plan"}):
                steps = kind.plan(job, world)
                await ctx.set_plan(steps)
            if steps:  # something to do: this attempt's trace is exported (tracing.job_span)
                tracing.materialize()
            # An empty plan applies nothing: no apply span (with tracing on, every span costs the
            # executor CPU per job — bench/run.py -w TRACING; a job with nothing to do is most of a drain).
            with metrics.phase(job, "apply"), (tracing.span("apply", {"z9.phase": "apply"}) if steps
                                               else contextlib.nullcontext()):
                for step in steps:
                    await ctx.check_superseded()  # a later job may have superseded this one
                    with tracing.span(f"step {step.name}", {"z9.step": step.name}):
                        await ctx.step_running(step)
                        await kind.apply(ctx, world, step)
                        await ctx.step_done(step)
            await ctx.check_superseded()  # … and before verify: a superseded job records nothing
            with metrics.phase(job, "verify"), tracing.span("verify", {"z9.phase": "verify"}):
                observed = await kind.verify(ctx)
        except (JobError, LeaseLost, asyncio.CancelledError, *TRANSIENT_DB_ERRORS, *ROW_LOCKED):
            raise
        except Exception as exc:  # a bug or an untranslated error: retrying is safe, say so loudly
            log.exception("job %s: unexpected error", job.id, extra=extra)
            raise InternalError(f"internal error: {exc.__class__.__name__}: {exc}") from exc
        ctx.finished = True
        try:
            await ctx.succeed(kind, observed)  # fenced finish + record, one transaction (maybe batched)
        except (LeaseLost, *TRANSIENT_DB_ERRORS):
            raise
        except Exception as exc:  # recording failed: the transaction rolled back; retry the job
            log.exception("job %s: recording the result failed", job.id, extra=extra)
            raise InternalError(f"internal error recording the result: {exc.__class__.__name__}: {exc}") from exc
        log.debug("job %s succeeded (%d steps)", job.id, len(ctx.steps), extra=extra)
        return _ended(ctx, "succeeded", "none")
    except LeaseLost as exc:
        log.warning("job %s: %s; abandoning it", job.id, exc, extra=extra)
        return _ended(ctx, "lost", "lease_lost")
    except ROW_LOCKED as exc:
        # Another session holds the job's row (an operator's transaction, a frozen API request):
        # waiting on it is no failure of the job — no attempt, no traceback.
        ctx.mark_running_step_failed()
        log.warning("job %s: its row is locked by another session (%s); waiting for it, no attempt spent",
                    job.id, exc, extra=extra)
        return await _wait_row_then_retry(ctx, exc, extra=extra)
    except Snooze as exc:
        ctx.mark_running_step_failed()
        tracing.record_error(exc)
        try:
            waited = await _snoozed_for(ctx)
        except LeaseLost as lost:
            log.warning("job %s: %s; abandoning it", job.id, lost, extra=extra)
            return _ended(ctx, "lost", "lease_lost")
        if waited <= ctx.settings.snooze_limit_s:
            return await _finish_retry(ctx, exc, exc.delay_s or ctx.settings.snooze_s, refund=True, extra=extra)
        temp = TemporaryError(f"{exc} (waited {waited:.0f}s on the world, longer than {ctx.settings.snooze_limit_s:.0f}s)")
        return await _finish_temporary(ctx, kind, temp, extra=extra)
    except PermanentError as exc:
        ctx.mark_running_step_failed()
        tracing.record_error(exc)
        if isinstance(exc, GuardRefusal):
            metrics.guard_refused(job)
        return await _finish_failed(ctx, kind, _error(exc), metrics.error_class(exc), extra=extra)
    except TemporaryError as exc:
        ctx.mark_running_step_failed()
        tracing.record_error(exc)
        return await _finish_temporary(ctx, kind, exc, extra=extra)


async def _wait_row_then_retry(ctx: JobContext, exc: BaseException, *, extra: dict[str, Any]) -> str:
    """Give the attempt back (``retry`` due now) once the job's row can be written again: each try
    waits the connection's ``lock_timeout``, then a pause growing to 5 s. The lease may run out
    meanwhile: then the job is another worker's (lost), as on any expiry."""
    pause = 0.2
    while True:
        try:
            return await _finish_retry(ctx, TemporaryError(f"waited for the job's row: {exc}"), 0.0,
                                       refund=True, extra=extra)
        except ROW_LOCKED as again:
            log.info("job %s: its row is still locked (%s); waiting %.1fs", ctx.job.id, again, pause, extra=extra)
            await asyncio.sleep(pause)
            pause = min(pause * 2, 5.0)


async def _snoozed_for(ctx: JobContext) -> float:
    """Seconds this job has been waiting on the world (first snooze kept in its memo)."""
    since = ctx.memo.get("snoozed_since")
    if since is None:
        await ctx.remember(snoozed_since=ctx.clock.time())
        return 0.0
    return ctx.clock.time() - float(since)


async def _finish_temporary(ctx: JobContext, kind: JobKind, exc: TemporaryError, *, extra: dict[str, Any]) -> str:
    """Retry with backoff, or fail when this was the last attempt. An attempt that made progress
    (a step done) is given back — the next one goes on from there, after the first backoff — up to
    ``max_attempts`` such times per job (kept in its memo), so a job that makes many steps (an
    lb-ha, a cluster) is not failed by passing faults spread over them; one that makes none is
    spent as before."""
    job = ctx.job
    done = sum(1 for s in ctx.steps if s.state == "done")
    refunds = int(ctx.memo.get("progress_refunds", 0))
    if done and refunds < job.max_attempts:
        try:
            await ctx.remember(progress_refunds=refunds + 1)
        except LeaseLost as lost:
            log.warning("job %s: %s; abandoning it", job.id, lost, extra=extra)
            return _ended(ctx, "lost", "lease_lost")
        delay = backoff_delay_s(1, base_s=ctx.settings.backoff_base_s, cap_s=ctx.settings.backoff_cap_s,
                                jitter=ctx.settings.backoff_jitter)
        log.info("job %s: attempt %d made progress (%d steps done): given back", job.id, job.attempt, done,
                 extra=extra)
        return await _finish_retry(ctx, exc, delay, refund=True, extra=extra, outcome="retry")
    if job.attempt >= job.max_attempts:
        err = _error(exc)
        err["message"] = f"out of attempts ({job.max_attempts}): {err['message']}"
        return await _finish_failed(ctx, kind, err, "attempts_exhausted", extra=extra)
    delay = backoff_delay_s(job.attempt, base_s=ctx.settings.backoff_base_s,
                            cap_s=ctx.settings.backoff_cap_s, jitter=ctx.settings.backoff_jitter)
    return await _finish_retry(ctx, exc, delay, refund=False, extra=extra)


async def _finish_retry(ctx: JobContext, exc: BaseException, delay_s: float, *, refund: bool,
                        extra: dict[str, Any], outcome: str | None = None) -> str:
    """``retry`` after ``delay_s``; ``refund`` gives the attempt back. The attempt's outcome is
    ``snoozed`` for a refund (waiting on the world), ``retry`` otherwise — or ``outcome`` (an
    attempt that made progress is given back but counted as the retry it was)."""
    ctx.finished = True
    try:
        await store.job_retry(ctx.pool, ctx.lease, ctx.steps_json(), _error(exc), delay_s,
                              refund_attempt=refund, now=ctx.clock.db_now())
    except LeaseLost as lost:
        log.warning("job %s: %s; abandoning it", ctx.job.id, lost, extra=extra)
        return _ended(ctx, "lost", "lease_lost")
    outcome = outcome or ("snoozed" if refund else "retry")
    log.warning("job %s: %s in %.1fs: %s", ctx.job.id, outcome, delay_s, exc, extra=extra)
    return _ended(ctx, "snoozed", "none") if outcome == "snoozed" else _ended(ctx, "retry", metrics.error_class(exc))


async def _finish_failed(ctx: JobContext, kind: JobKind, err: dict[str, Any], error_class: str, *,
                         extra: dict[str, Any]) -> str:
    ctx.finished = True
    try:
        async with ctx.pool.acquire() as conn, conn.transaction():
            await store.job_fail(conn, ctx.lease, ctx.steps_json(), err)
            await kind.record_failure(conn, ctx, err)
    except LeaseLost as lost:
        log.warning("job %s: %s; abandoning it", ctx.job.id, lost, extra=extra)
        return _ended(ctx, "lost", "lease_lost")
    log.error("job %s failed: %s", ctx.job.id, err["message"], extra=extra)
    return _ended(ctx, "failed", error_class)


def _ended(ctx: JobContext, outcome: str, error_class: str) -> str:
    """Count the attempt's end in ``z9_job_attempts_total`` (``lost`` as ``lease_lost``) and
    return ``outcome``."""
    metrics.attempt_ended(ctx.job, "lease_lost" if outcome == "lost" else outcome, error_class,
                          ctx.claimed_at)
    return outcome


async def hand_over(ctx: JobContext, reason: str) -> bool:
    """Give a job back (``retry`` due now, attempt refunded) when this worker stops; False when
    the lease was already lost."""
    ctx.mark_running_step_failed()
    try:
        await store.job_retry(ctx.pool, ctx.lease, ctx.steps_json(),
                              {"class": "temporary", "message": reason,
                               "at": utc_now_iso()},
                              0.0, refund_attempt=True, now=ctx.clock.db_now())
        return True
    except LeaseLost:
        return False
