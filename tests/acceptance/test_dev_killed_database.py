"""``z9 dev`` killed outright (SIGKILL, the OOM killer) leaves its embedded PostgreSQL
running — pg_ctl daemonizes it, so no parent-death signal reaches it. Worse, the wheel keeps a
list of the processes holding the server (``<pgdata>/.handle_pids.json``) and stops it only when
the last one lets go: the dead ``z9 dev`` stays on that list forever, so every later ``z9 dev`` on
that data directory, even one stopped with Ctrl-C, leaves the server running too.
"""
from __future__ import annotations

import asyncio
import signal
from pathlib import Path

from tests.support import free_port
from tests.acceptance.test_dev import _alive, _metrics_base, _services_of, _start, _wait_banner, _wait_gone


def _postmaster(data_dir: Path) -> int:
    return int((data_dir / "pg" / "postmaster.pid").read_text().split()[0])


async def test_z9_dev_after_a_sigkill_still_stops_its_database(tmp_path: Path) -> None:
    data_dir = tmp_path / ".z9"
    port, metrics_base = free_port(), _metrics_base()
    proc = _start(data_dir, port, metrics_base)
    pg = None
    try:
        await asyncio.to_thread(_wait_banner, proc)
        pg = _postmaster(data_dir)
        services = _services_of(proc.pid)
        assert len(services) >= 4, services
        proc.kill()  # no shutdown runs
        proc.wait()
        # its services follow it (parent-death signal, then their own shutdown): the next z9 dev starts once
        # they are gone — they hold the ports it is given again
        assert await asyncio.to_thread(_wait_gone, services, 60) == [], "z9 dev's services outlived it"
        # the next z9 dev on that folder takes the server over …
        proc = _start(data_dir, port, metrics_base)
        await asyncio.to_thread(_wait_banner, proc)
        pg = _postmaster(data_dir)
        # … and, stopped with Ctrl-C, stops it: nothing of z9 dev is left running
        proc.send_signal(signal.SIGINT)
        await asyncio.to_thread(proc.communicate, None, 60)
        assert await asyncio.to_thread(_wait_gone, [pg], 30) == [], "the embedded PostgreSQL outlived z9 dev"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if pg is not None and _alive(pg):
            import os
            os.kill(pg, signal.SIGTERM)
