"""Long-poll of a job: ``GET /v1/jobs/{id}?wait_s=N`` answers as soon as the job's status or
steps change, or after N seconds (at most 60) with the job as it is.

How: one ``LISTEN z9_job_changed`` connection per API process (:class:`JobWaiters`), opened
through :func:`z9.common.db.connect_listener` like the executor's. The executor, scheduler and
API write a job's status and steps in statements that also ``pg_notify`` the job id (see the
head of ``queries/jobs.sql``), so a change costs no extra commit. Waiters are coalesced per job id:
however many requests wait on one job, they share one slot, woken by one notification.

A waiter registers its slot *before* it reads the job, so a change made between the read and
the wait still wakes it; a wakeup that changed nothing the client sees (another notification,
a catch-up after a reconnect) is read and waited through. While the LISTEN connection is down,
waiters re-read the job every ``FALLBACK_POLL_S`` seconds instead: late by at most that, never
stuck.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Iterator
from contextlib import contextmanager

from aiohttp import web

from z9.common import metrics
from z9.common.clock import SYSTEM, Clock
from z9.common.db import JOB_CHANGED_CHANNEL, connect_listener
from z9.common.errors import BadRequest, NotFound
from z9.common.models import Job
from z9.common.settings import Settings

log = logging.getLogger("z9.api")

MAX_WAIT_S = 60
RETRY_AFTER_S = 5  # the hint on a non-terminal job: the seeds' polling interval
FALLBACK_POLL_S = 1.0
GONE_CHECK_S = 2.0  # how often a waiter checks that its client is still connected
TERMINAL = ("succeeded", "failed")


@dataclass
class _Slot:
    """The waiters of one job id: ``event`` is set (and replaced) by the job's next
    notification (``gen`` counts them); ``reads`` holds the read made after notification
    ``gen`` for each reader key, which every waiter woken by it shares."""

    event: asyncio.Event = field(default_factory=asyncio.Event)
    refs: int = 0
    gen: int = 0
    reads: dict[Any, tuple[int, "asyncio.Task[Job | None]"]] = field(default_factory=dict)


class JobWaiters:
    """The API process's job-change listener and its waiters (create inside the event loop;
    :meth:`start`, then :meth:`stop` on the way out)."""

    def __init__(self, settings: "Settings", *, application_name: str = "z9-api-listen", clock: Clock = SYSTEM):
        self.settings = settings
        self.clock = clock  # a wait's wait_s run on it
        self.application_name = application_name
        self.listening = False  # True while the LISTEN connection is established
        self.notifications = 0  # notifications received (tests, benchmarks)
        self.reads = 0  # job reads made after a wakeup (shared by the waiters it woke)
        self.baselines = 0  # waiters that made their first read (what a change is measured against)
        self._slots: dict[str, _Slot] = {}
        self._task: asyncio.Task[None] | None = None
        self._up = asyncio.Event()
        self.closing = False

    @property
    def waiting(self) -> int:
        """Requests waiting now (all job ids)."""
        return sum(s.refs for s in self._slots.values())

    async def start(self) -> None:
        metrics.API_JOB_WAITERS.set_function(lambda: self.waiting)
        metrics.API_LISTEN_HEALTHY.set_function(lambda: 1 if self.listening else 0)
        self._task = asyncio.get_running_loop().create_task(self._listen_loop(), name="z9-api-listen")

    async def wait_listening(self, timeout_s: float) -> bool:
        """Until the LISTEN connection is up (tests); False after ``timeout_s``."""
        try:
            await asyncio.wait_for(self._up.wait(), timeout_s)
            return True
        except TimeoutError:
            return False

    def close(self) -> None:
        """The server is shutting down: every waiter answers now with the job as it is (so a
        graceful shutdown does not wait out their waits), and new waits do not wait."""
        self.closing = True
        self._wake_all()

    async def stop(self) -> None:
        self.close()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self._wake_all()

    # ------------------------------------------------------------------ listening

    def _on_notify(self, _conn: Any, _pid: int, _channel: str, payload: str) -> None:
        self.notifications += 1
        slot = self._slots.get(payload)
        if slot is not None:
            _wake(slot)

    def _wake_all(self) -> None:
        for slot in self._slots.values():
            _wake(slot)

    async def _listen_loop(self) -> None:
        delay = 0.2
        while True:
            conn = None
            try:
                conn = await connect_listener(self.settings, application_name=self.application_name)
                lost = asyncio.Event()
                conn.add_termination_listener(lambda _c: lost.set())
                await conn.add_listener(JOB_CHANGED_CHANNEL, self._on_notify)
                self.listening = True
                self._up.set()
                self._wake_all()  # catch up: a change made while not listening was not heard
                log.info("LISTEN %s established", JOB_CHANGED_CHANNEL)
                delay = 0.2
                while not lost.is_set():
                    try:
                        await asyncio.wait_for(lost.wait(), timeout=10)
                    except TimeoutError:
                        await conn.fetchval("SELECT 1", timeout=5)
                log.warning("LISTEN %s connection lost; re-establishing", JOB_CHANGED_CHANNEL)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # TRANSIENT_DB_ERRORS and protocol errors alike
                log.warning("LISTEN %s failed (%s); waiters poll meanwhile; retrying in %.1fs",
                            JOB_CHANGED_CHANNEL, e, delay)
            finally:
                self.listening = False
                self._up.clear()
                if conn is not None:
                    conn.terminate()
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)

    # ------------------------------------------------------------------ waiting

    @contextmanager
    def _watch(self, job_id: str) -> Iterator[_Slot]:
        slot = self._slots.get(job_id)
        if slot is None:
            slot = self._slots[job_id] = _Slot()
        slot.refs += 1
        try:
            yield slot
        finally:
            slot.refs -= 1
            if slot.refs == 0 and self._slots.get(job_id) is slot:
                del self._slots[job_id]

    async def _shared_read(self, slot: _Slot, key: Any, read: Callable[[], Awaitable[Job | None]]) -> Job | None:
        """The job read once per wakeup for all waiters with reader key ``key`` (the tenant)."""
        hit = slot.reads.get(key)
        if hit is None or hit[0] != slot.gen:
            self.reads += 1
            hit = (slot.gen, asyncio.get_running_loop().create_task(read()))
            slot.reads[key] = hit
        return await asyncio.shield(hit[1])

    async def wait(self, job_id: str, read: Callable[[], Awaitable[Job | None]], wait_s: float,
                   read_key: Any = None, gone: Callable[[], bool] | None = None) -> Job | None:
        """``read()`` the job; if it is not terminal, wait up to ``wait_s`` seconds for its
        status, attempt or steps to change and return it as it then is (None: not found).
        Waiters of one job with the same ``read_key`` (the tenant: ``read`` must answer the
        same for them) share the read made after each wakeup. ``gone()`` true: the client
        left (checked every ``GONE_CHECK_S``), stop waiting."""
        clock = self.clock
        with self._watch(job_id) as slot:
            event = slot.event  # taken before the read: a change after it wakes us
            first = await read()
            self.baselines += 1
            if first is None or first.status in TERMINAL or wait_s <= 0 or self.closing:
                return first
            deadline = clock.monotonic() + wait_s
            current = first
            while True:
                remaining = deadline - clock.monotonic()
                if remaining <= 0:
                    return current
                step = remaining if self.listening else min(remaining, FALLBACK_POLL_S)
                if gone is not None:
                    step = min(step, GONE_CHECK_S)
                woke = await clock.wait_for(event, step)
                if gone is not None and gone():
                    return current
                if not woke and self.listening:
                    continue  # nothing changed; the deadline is checked at the top
                event = slot.event
                current = await self._shared_read(slot, read_key, read)
                if current is None or _changed(first, current) or self.closing:
                    return current


def _wake(slot: _Slot) -> None:
    old, slot.event = slot.event, asyncio.Event()
    slot.gen += 1
    slot.reads.clear()
    old.set()


def _changed(a: Job, b: Job) -> bool:
    return a.status != b.status or a.attempt != b.attempt or a.steps != b.steps


def parse_wait_s(request: web.Request) -> int:
    """The ``wait_s`` query parameter: a whole number of seconds from 0 to 60 (0 or absent:
    answer at once). A 400 naming it otherwise."""
    raw = request.query.get("wait_s")
    if raw is None:
        return 0
    if not raw.isascii() or not raw.isdigit() or len(raw) > 3 or int(raw) > MAX_WAIT_S:
        raise BadRequest(f"wait_s: must be a whole number of seconds from 0 to {MAX_WAIT_S}, not {raw!r}",
                         details=[{"field": "wait_s", "message": f"integer 0..{MAX_WAIT_S}"}])
    return int(raw)


WAITERS = web.AppKey("job_waiters", JobWaiters)


async def get_job(request: web.Request) -> web.Response:
    """``GET /v1/jobs/{id}[?wait_s=N]``: the job; with ``wait_s``, once it changed or after N
    seconds. A non-terminal job's answer carries ``Retry-After: 5`` for clients that poll."""
    from z9.common import store

    from . import resources as api
    from . import schemas

    jid = api.path_id(request, "job", "job")
    wait_s = parse_wait_s(request)
    pool, tenant = request.app[api.POOL], api.tenant(request)

    async def read() -> Job | None:
        return await store.job_get(pool, jid, tenant)

    def gone() -> bool:
        transport = request.transport
        return transport is None or transport.is_closing()

    job = await request.app[WAITERS].wait(jid, read, wait_s, tenant, gone) if wait_s else await read()
    if job is None:
        raise NotFound(f"no job {jid!r}")
    resp = web.json_response(api.dump(schemas.Job, job.public()))
    if job.status not in TERMINAL:
        resp.headers["Retry-After"] = str(RETRY_AFTER_S)
    return resp


def install(app: web.Application, settings: "Settings", clock: Clock = SYSTEM) -> None:
    """Give ``app`` its job waiters (LISTEN started with the app, stopped on cleanup)."""

    async def ctx(app: web.Application) -> Any:
        app[WAITERS] = JobWaiters(settings, clock=clock)
        await app[WAITERS].start()
        yield
        await app[WAITERS].stop()

    async def on_shutdown(app: web.Application) -> None:  # before aiohttp waits for handlers
        app[WAITERS].close()

    app.cleanup_ctx.append(ctx)
    app.on_shutdown.append(on_shutdown)
