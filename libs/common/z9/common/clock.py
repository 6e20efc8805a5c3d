"""The one clock services read time through, so that tests can hold time still or move it on.

Every decision that depends on time — a lease's expiry, a retry's backoff, a deletion buffer, a
snooze's limit, a token's expiry, a cache's age — reads it from a :class:`Clock` handed down from
``main`` (as the settings are), never from ``time``/``datetime`` directly:

- :meth:`Clock.now` — the wall time (an aware UTC ``datetime``), for what is compared with rows;
- :meth:`Clock.time` — the same as seconds since the epoch (``time.time()``), for what is stored
  as a number (a job's memo);
- :meth:`Clock.monotonic` — for intervals inside one process (``time.monotonic()``);
- :meth:`Clock.sleep` — waits until that much of *this clock's* time has passed;
- :meth:`Clock.wait_for` — waits for an ``asyncio.Event``, at most that much of this clock's time;
- :meth:`Clock.db_now` — what the store passes as the ``now`` of its time-dependent queries
  (``coalesce($n::timestamptz, now())``, as River does): ``None`` for the real clock, so the
  database's own ``now()`` decides in production; the clock's time for a test clock, so the
  rows' deadlines and the services' comparisons move together when a test steps it.

:class:`SystemClock` is the real one (:data:`SYSTEM`, the default everywhere). :class:`TestClock`
follows real time plus an offset the test moves forward with :meth:`TestClock.step` (sleepers of
the clock wake at once when a step takes them past their end), or stands still after
:meth:`TestClock.pin`. It never goes back: rows stamped by the database's own ``now()`` are never
later than the test clock's time, so nothing looks younger than it is — but for a clock pinned
before such a row was written (pin once the rows a test starts from exist).
"""
from __future__ import annotations

import asyncio
import time as _time
from datetime import datetime, timezone
from typing import Protocol


class Clock(Protocol):
    """What services read time through (see the module docstring)."""

    def now(self) -> datetime: ...
    def time(self) -> float: ...
    def monotonic(self) -> float: ...
    def db_now(self) -> datetime | None: ...
    async def sleep(self, seconds: float) -> None: ...
    async def wait_for(self, event: asyncio.Event, timeout: float) -> bool: ...


class SystemClock:
    """The real clock: ``time``, ``datetime`` and ``asyncio.sleep``; the database's ``now()``."""

    def now(self) -> datetime:
        return datetime.now(timezone.utc)

    def time(self) -> float:
        return _time.time()

    def monotonic(self) -> float:
        return _time.monotonic()

    def db_now(self) -> datetime | None:
        return None

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def wait_for(self, event: asyncio.Event, timeout: float) -> bool:
        """True once ``event`` is set, False after ``timeout`` seconds without it."""
        try:
            await asyncio.wait_for(event.wait(), timeout)
            return True
        except TimeoutError:
            return False


SYSTEM = SystemClock()


class TestClock:
    """A clock tests move: real time plus an offset that only grows (:meth:`step`), or time held
    still (:meth:`pin`). Its :meth:`db_now` is its own time, so the store's time-dependent
    queries see what the services see."""

    __test__ = False  # not a pytest test class

    def __init__(self) -> None:
        self._offset = 0.0
        self._pinned_at: float | None = None  # real monotonic time at which it was pinned
        self._wall0 = _time.time() - _time.monotonic()  # wall = monotonic + _wall0, read once
        self._stepped: asyncio.Event | None = None

    def _real(self) -> float:
        return _time.monotonic() if self._pinned_at is None else self._pinned_at

    def monotonic(self) -> float:
        return self._real() + self._offset

    def time(self) -> float:
        return self.monotonic() + self._wall0

    def now(self) -> datetime:
        return datetime.fromtimestamp(self.time(), timezone.utc)

    def db_now(self) -> datetime | None:
        return self.now()

    def pin(self) -> None:
        """Hold time still (until :meth:`unpin`); :meth:`step` still moves it."""
        if self._pinned_at is None:
            self._pinned_at = _time.monotonic()

    def unpin(self) -> None:
        """Let time run again from where it stands (never backwards)."""
        if self._pinned_at is not None:
            self._offset -= _time.monotonic() - self._pinned_at
            self._pinned_at = None

    def step(self, seconds: float) -> None:
        """Move time forward by ``seconds``; every :meth:`sleep` it carries past its end returns."""
        if seconds < 0:
            raise ValueError("a clock never goes back")
        self._offset += seconds
        if self._stepped is not None:
            self._stepped.set()
            self._stepped = None

    def step_past(self, when: datetime | float) -> None:
        """Move time forward to just after ``when`` (a ``datetime`` or an epoch time), if it is
        not there yet."""
        at = when.timestamp() if isinstance(when, datetime) else float(when)
        self.step(max(0.0, at - self.time() + 0.001))

    def _step_event(self) -> asyncio.Event:
        if self._stepped is None:
            self._stepped = asyncio.Event()
        return self._stepped

    async def sleep(self, seconds: float) -> None:
        end = self.monotonic() + seconds
        while (left := end - self.monotonic()) > 0:
            stepped = self._step_event()
            try:
                await asyncio.wait_for(stepped.wait(), None if self._pinned_at is not None else left)
            except TimeoutError:
                pass
        await asyncio.sleep(0)

    async def wait_for(self, event: asyncio.Event, timeout: float) -> bool:
        """True once ``event`` is set, False once this clock has moved ``timeout`` seconds on
        (running, or stepped) without it."""
        end = self.monotonic() + timeout
        while not event.is_set():
            left = end - self.monotonic()
            if left <= 0:
                return False
            waits = [asyncio.ensure_future(event.wait()), asyncio.ensure_future(self._step_event().wait())]
            try:
                await asyncio.wait(waits, timeout=None if self._pinned_at is not None else left,
                                   return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits:
                    w.cancel()
        return True
