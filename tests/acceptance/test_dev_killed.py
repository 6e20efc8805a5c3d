"""``z9 dev`` killed outright (SIGKILL, the OOM killer): nothing of it is left running — its
services die with it (parent-death signal) and so does its embedded PostgreSQL, which ``pg_ctl``
daemonized out of reach of that signal (stopped by ``z9.pg_watchdog`` when ``z9 dev``'s end of a
pipe closes). And the next ``z9 dev`` on that data directory starts cleanly."""
from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

from tests.support import free_port
from tests.acceptance.test_dev import _alive, _metrics_base, _start, _stop, _wait_banner, _wait_gone


def _postmaster(data_dir: Path) -> int:
    return int((data_dir / "pg" / "postmaster.pid").read_text().split()[0])


async def test_a_sigkilled_z9_dev_leaves_no_postgres_running(tmp_path: Path) -> None:
    data_dir = tmp_path / ".z9"
    port, metrics_base = free_port(), _metrics_base()
    proc = _start(data_dir, port, metrics_base)
    pgs: list[int] = []
    try:
        await asyncio.to_thread(_wait_banner, proc)
        pgs.append(_postmaster(data_dir))
        assert _alive(pgs[0])
        proc.kill()  # no shutdown of z9 dev's runs
        proc.wait()
        assert await asyncio.to_thread(_wait_gone, pgs, 60) == [], "the embedded PostgreSQL outlived z9 dev"
        assert not (data_dir / "pg" / "postmaster.pid").exists()  # a clean shutdown, not a crash

        # the next z9 dev on the folder starts its own server and stops it with Ctrl-C
        proc = _start(data_dir, port, metrics_base)
        await asyncio.to_thread(_wait_banner, proc)
        pgs.append(_postmaster(data_dir))
        out = await asyncio.to_thread(_stop, proc)
        assert proc.returncode == 0, out
        assert await asyncio.to_thread(_wait_gone, pgs, 60) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in pgs:
            if _alive(pid):
                os.kill(pid, signal.SIGQUIT)
