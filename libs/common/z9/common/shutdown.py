"""Every service stops on SIGTERM or SIGINT, whatever it is waiting on.

The first signal asks for a graceful stop (the service's own ``stop``: the API closes its port and
answers its waiters, the executor drains for ``Z9_SHUTDOWN_GRACE_S``). A graceful stop may wait on
the database — closing a pool sends each connection's Terminate and waits for the server's answer,
a statement waits for its result — and a database gone silent (a host paused or cut off, a server
stopping under it as ``z9 dev``'s does when ``z9 dev`` is killed) never answers: the process then
stayed, its port closed, its LISTEN loop retrying, deaf to further signals (its handler only set
an event already set). So a stop has a deadline: ``Z9_SHUTDOWN_GRACE_S`` + :data:`HARD_EXIT_MARGIN_S`
after the first signal, or at once on a second one, the process exits (``os._exit``, from a thread:
a blocked event loop cannot hold it back), after one log line saying why.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable

log = logging.getLogger("z9.shutdown")

#: seconds past the service's own grace (the executor's drain) before a stop is forced
HARD_EXIT_MARGIN_S = 10.0  # room for a drain's hand-over and a pool's close on a loaded machine
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _hard_exit(code: int, why: str) -> None:
    log.warning("%s: exiting now", why)
    for flush in (*(h.flush for h in logging.getLogger().handlers), sys.stdout.flush, sys.stderr.flush):
        with contextlib.suppress(Exception):  # nothing may keep the process from ending
            flush()
    os._exit(code)


class StopGuard:
    """The stop signals of one service process: the first calls ``stop`` and starts the deadline,
    a second exits at once. :meth:`install` on the running loop (it replaces any handler there)."""

    def __init__(self, stop: Callable[[], None], deadline_s: float):
        self.stop = stop
        self.deadline_s = deadline_s
        self.signals = 0
        self._timer: threading.Timer | None = None

    def _on_signal(self, sig: signal.Signals) -> None:
        self.signals += 1
        if self.signals > 1:
            _hard_exit(128 + sig, f"{sig.name} again while stopping")
        log.info("%s: stopping (a second signal, or %.0fs, ends the process at once)", sig.name, self.deadline_s)
        self._timer = threading.Timer(self.deadline_s, _hard_exit,
                                      args=(1, f"not stopped {self.deadline_s:.0f}s after {sig.name}"))
        self._timer.daemon = True  # a process that stopped in time ends without waiting for it
        self._timer.start()
        self.stop()

    def install(self, loop: asyncio.AbstractEventLoop | None = None) -> StopGuard:
        loop = loop or asyncio.get_running_loop()
        for sig in STOP_SIGNALS:
            loop.add_signal_handler(sig, self._on_signal, sig)
        return self


def guard_stop(stop: Callable[[], None], grace_s: float) -> StopGuard:
    """On the running loop: SIGTERM/SIGINT call ``stop``; the process ends at the latest
    ``grace_s`` + :data:`HARD_EXIT_MARGIN_S` later, or at a second signal."""
    return StopGuard(stop, grace_s + HARD_EXIT_MARGIN_S).install()
