"""Coalesced job notifications: one ``NOTIFY z9_jobs`` per burst of enqueues, sent after commit.

Why: a transaction that called ``NOTIFY`` takes PostgreSQL's notify-queue lock in its commit
and holds it until the commit has finished (including the WAL flush). So concurrent
enqueuing transactions that each NOTIFY commit one after another, one fsync each, instead
of sharing a group commit — commit latency grows with the number of concurrent producers
(bench/README.md: the ``notify_burst`` measurement).

How: a producer commits its jobs without NOTIFY (``store.job_insert(..., notify=False)``)
and then calls :meth:`JobNotifier.notify` (non-blocking). The notifier sends the pending
regions in one autocommit ``SELECT pg_notify(...)`` statement — a transaction that writes
nothing, so it holds the lock only for microseconds; while one send is in flight, further
requests merge into the next one. A burst of N enqueues thus costs one or two NOTIFYs.

Trade-off: the notification is no longer atomic with the commit. If the producer dies (or
the database connection fails) between its commit and the send, no NOTIFY goes out, and the
executor finds the job on its next poll (``poll_interval_s``, 5 s by default) or on its
catch-up claim after a LISTEN reconnect — the job is late, never lost. Executors claim on
every notification and after every finished job, so a merged notification wakes as much
work as the separate ones would have.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Iterable

import asyncpg

from . import store
from .db import TRANSIENT_DB_ERRORS

log = logging.getLogger("z9.notify")


class JobNotifier:
    """Sends ``NOTIFY z9_jobs, '<region>'`` for regions that got new claimable jobs, coalescing
    concurrent requests. ``pool``: an asyncpg pool (or connection) it may use for one statement
    at a time. Create one per process, inside its event loop."""

    def __init__(self, pool: asyncpg.Pool | asyncpg.Connection):
        self.pool = pool
        self._pending: set[str] = set()
        self._task: asyncio.Task[None] | None = None
        self.sent = 0  # NOTIFY statements sent (for tests and benchmarks)

    def notify(self, regions: str | Iterable[str]) -> None:
        """Ask for a NOTIFY of ``regions`` (after the enqueue committed). Returns at once; the
        statement runs in the background, merged with any other request made meanwhile."""
        self._pending.update([regions] if isinstance(regions, str) else regions)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._send(), name="z9-notify")

    async def _send(self) -> None:
        while self._pending:
            regions, self._pending = sorted(self._pending), set()
            try:
                await store.jobs_notify(self.pool, regions)
                self.sent += 1
            except TRANSIENT_DB_ERRORS as e:
                # Not retried: the executors' poll and catch-up claims find the jobs anyway.
                log.warning("NOTIFY of %s failed (%s); executors will find the jobs on their next poll",
                            ",".join(regions), e)
            except Exception:
                log.exception("NOTIFY of %s failed", ",".join(regions))

    async def flush(self) -> None:
        """Wait until every requested NOTIFY has been sent (or has failed)."""
        while self._task is not None and not self._task.done():
            await asyncio.shield(self._task)
