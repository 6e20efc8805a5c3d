"""``z9 dev`` killed outright (SIGKILL) ten times in a row, at different moments of its life (the
simulator just started, the services starting, the stack up): every time, every child is gone
within seconds — the embedded PostgreSQL stops under them at the same moment (its watchdog), so a
service shutting down finds its database gone and must still exit (a LISTEN reconnect loop, a
pool closing against a dead server). Also: a service told SIGTERM while its database is
unreachable exits."""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.acceptance.test_dev import (
    _alive,
    _metrics_base,
    _services_of,
    _start,
    _wait_gone,
)
from tests.support import free_port, poll_sync

ROUNDS = 10
#: how long the children may take to go before the test fails (the target is a few seconds; the
#: figures are printed): a bound for a failure, not a wait — the test goes on as soon as they are gone
GONE_BOUND_S = 45


def _postmaster(data_dir: Path) -> int | None:
    try:
        return int((data_dir / "pg" / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _kill_point(proc: subprocess.Popen, round_: int) -> None:
    """Wait for the moment of round ``round_`` to kill ``z9 dev`` at (each an event): 1 child (the
    simulator), 3 (services starting), or the banner (the stack up)."""
    want = (1, 3, 5)[round_ % 3]
    if want == 5:
        deadline = time.monotonic() + 180
        assert proc.stdout is not None
        for line in proc.stdout:
            if "Ctrl-C stops everything" in line or time.monotonic() > deadline:
                return
        raise AssertionError(f"z9 dev exited with {proc.wait()} before its banner")
    poll_sync(lambda: len(_services_of(proc.pid)) >= want or proc.poll() is not None, 180,
              f"z9 dev to start {want} children", interval_s=0.02)


async def test_z9_dev_sigkilled_ten_times_leaves_no_child(tmp_path: Path) -> None:
    data_dir = tmp_path / ".z9"
    port, metrics_base = free_port(), _metrics_base()
    figures = []
    everything: list[int] = []
    proc: subprocess.Popen | None = None
    try:
        for round_ in range(ROUNDS):
            proc = _start(data_dir, port, metrics_base)
            await asyncio.to_thread(_kill_point, proc, round_)
            kids = _services_of(proc.pid)
            postmaster = _postmaster(data_dir)
            everything += kids
            if proc.poll() is not None:
                raise AssertionError(f"round {round_}: z9 dev exited with {proc.returncode}: {proc.communicate()[0]}")
            proc.kill()
            proc.wait()
            t0 = time.monotonic()
            left = await asyncio.to_thread(_wait_gone, kids, GONE_BOUND_S)
            figures.append(time.monotonic() - t0)
            assert left == [], (round_, [(p, Path(f"/proc/{p}/cmdline").read_bytes()) for p in left])
            if postmaster is not None:  # and its database, stopped by its watchdog (before the next round)
                assert await asyncio.to_thread(_wait_gone, [postmaster], 90) == [], (round_, "postgres left")
        print(f"children gone after a SIGKILL of z9 dev: {', '.join(f'{s:.1f}s' for s in figures)}")
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in everything:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


class _DatabaseLink:
    """A TCP relay between the services and PostgreSQL that the test can cut, as a database
    stopping under them (z9 dev's watchdog stops the embedded one when z9 dev is killed): open
    connections reset, new ones refused."""

    def __init__(self, host: str, port: int):
        self.target = (host, port)  # host: a name, or the directory of PostgreSQL's Unix socket
        self.writers: list[asyncio.StreamWriter] = []
        self.frozen = False
        self.server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.frozen:  # accepted, never answered
            self.writers.append(writer)
            return
        try:
            host, port = self.target
            up_reader, up_writer = (await asyncio.open_unix_connection(f"{host}/.s.PGSQL.{port}")
                                    if host.startswith("/") else await asyncio.open_connection(host, port))
        except OSError:
            writer.close()
            return
        self.writers += [writer, up_writer]

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    if self.frozen:
                        await asyncio.Event().wait()  # held open, never relayed
                    dst.write(data)
                    await dst.drain()
            except (OSError, asyncio.IncompleteReadError):
                pass
            finally:
                dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    async def cut(self) -> None:
        assert self.server is not None
        self.server.close()
        for w in self.writers:
            w.transport.abort()
        await self.server.wait_closed()

    def freeze(self) -> None:
        """The database host gone silent (paused, partitioned): connections stay open and
        accepted, nothing is answered."""
        self.frozen = True


async def _read_until(proc: subprocess.Process, *needles: str, what: str) -> str:
    """The service's output until a line holding one of ``needles`` (the event waited for)."""
    seen = []
    assert proc.stdout is not None
    while True:
        line = (await asyncio.wait_for(proc.stdout.readline(), GONE_BOUND_S * 4)).decode(errors="replace")
        if not line:
            raise AssertionError(f"exited with {await proc.wait()} before {what}: {''.join(seen)}")
        seen.append(line)
        if any(n in line for n in needles):
            return "".join(seen)


@pytest.mark.parametrize("how", ["stopped", "silent"])
async def test_a_service_exits_on_sigterm_once_its_database_is_gone(db_url: str, how: str) -> None:
    """The api, scheduler, executor and reaper running, then their database gone under them —
    stopped (connections reset: reconnect loops) or silent (nothing answers: a statement, a close
    waiting forever) —: SIGTERM, or SIGINT, ends each."""
    from urllib.parse import parse_qs, urlsplit, urlunsplit

    u = urlsplit(db_url)
    socket_dir = parse_qs(u.query).get("host", [""])[0]  # the embedded test server's: a Unix socket
    link = _DatabaseLink(socket_dir or u.hostname or "127.0.0.1", u.port or 5432)
    await link.start()
    via = urlunsplit(u._replace(netloc=f"{u.username or 'postgres'}@127.0.0.1:{link.port}", query=""))
    env = {k: v for k, v in os.environ.items() if not k.startswith("Z9_")}
    # a grace of 1 s: the stop's deadline is that + 10 s (z9.common.shutdown); without one, a silent
    # database held the API past any bound
    env.update(Z9_DATABASE_URL=via, Z9_METRICS_PORT="0", Z9_LOG_FORMAT="text", Z9_SHUTDOWN_GRACE_S="1",
               Z9_REGIONS='{"dev-1": {"url": "https://127.0.0.1:9", "token_id": "root@pam!z9", '
                          '"token_secret": "x", "verify_ssl": false}}')
    procs = {}
    try:
        for service, extra in (("api", ["--port", str(free_port())]), ("scheduler", []),
                               ("executor", ["--region", "dev-1"]), ("reaper", [])):
            procs[service] = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "z9", service, *extra, env=env, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT)
        await _read_until(procs["api"], "LISTEN z9_job_changed established", what="its LISTEN")
        await _read_until(procs["executor"], "LISTEN", "listening", what="its LISTEN")
        if how == "stopped":
            await link.cut()
            for service in ("api", "executor", "scheduler", "reaper"):
                await _read_until(procs[service], "unreachable", "failed", "lost", "retrying",
                                  what="noticing the database gone")
        else:
            link.freeze()
        for service, proc in procs.items():
            proc.send_signal(signal.SIGINT if service == "executor" else signal.SIGTERM)
        for service, proc in procs.items():
            try:
                await asyncio.wait_for(proc.wait(), GONE_BOUND_S)
            except TimeoutError:
                raise AssertionError(f"{service} ignored its stop signal with its database gone") from None
    finally:
        for proc in procs.values():
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
