"""One z9 executor process for the drain/latency benchmarks (started by ``bench/run.py``).

Protocol on stdin/stdout (one line each): the parent writes ``go`` → the executor starts (pool,
LISTEN, claims: start-up is inside the measured window) and the child answers ``started``;
the parent writes ``stop`` → the child prints ``{"cpu_s": …, "user_s": …, "sys_s": …, "round_trips": …}``
(process CPU seconds, user + system, and each, since ``go``; ``steady_cpu_s_per_job``: from the
first job's handler to the last one's, per job — :data:`noop.STEADY`; statements sent to PostgreSQL, BEGIN/COMMIT included), stops
the executor and exits.

Usage: ``executor_child.py DSN CONCURRENCY [PLAN_CACHE_MODE|-]``

``Z9_BENCH_CALLGRIND=<dir>``: the parent runs this process under ``valgrind --tool=callgrind
--instr-atstart=no``; instructions are counted from the first job's handler to ``stop``
(``bench/callgrind_marks.c``, built here into ``<dir>``), the parent reads the dump.

``Z9_BENCH_PROFILE=<file>``: the executor runs under :mod:`cProfile` from ``go`` to ``stop``; the
stats go to ``<file>.c<CONCURRENCY>`` (``python -m pstats``, or ``bench/README.md`` for the top).
"""
from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import noop  # noqa: E402

from z9.common import db as z9db  # noqa: E402
from z9.common.logs import setup_logging  # noqa: E402
from z9.common.settings import Settings  # noqa: E402
from z9.executor.worker import Executor  # noqa: E402


class _NoClient:
    """The no-op kind talks to no hypervisor."""

    def close(self) -> None:
        return None


def strip_job_change_notify() -> None:
    """Remove the ``pg_notify('z9_job_changed', …)`` column from every named query (the code as
    it was before the job long-poll), to measure what those notifications cost the executor."""
    import re

    from z9.common import sql

    pattern = re.compile(r",\s*pg_notify\('z9_job_changed', [a-z]+\.id\)::text AS notified")
    qs = sql.queries()
    for name, text in qs.items():
        qs[name] = pattern.sub("", text)
    assert not any("z9_job_changed" in t for t in qs.values())


def load_callgrind_marks(folder: str) -> Any:
    """``bench/callgrind_marks.c`` built into ``folder`` and loaded (its start/stop marks)."""
    import ctypes
    import subprocess

    so = os.path.join(folder, "callgrind_marks.so")
    subprocess.run(["cc", "-O1", "-shared", "-fPIC", "-o", so,
                    os.path.join(os.path.dirname(os.path.abspath(__file__)), "callgrind_marks.c")], check=True)
    return ctypes.CDLL(so)


ROUND_TRIPS = 0


def count_round_trips() -> None:
    """Count the executor's round trips to PostgreSQL: every statement call on a connection
    (``execute``/``fetch*``/``executemany``, which is also how transactions send BEGIN and COMMIT)
    is one. Prepares are not counted (asyncpg caches them per connection: once per statement)."""
    import asyncpg

    def wrap(name: str) -> None:
        orig = getattr(asyncpg.Connection, name)

        async def counted(self: Any, *a: Any, **kw: Any) -> Any:
            global ROUND_TRIPS
            ROUND_TRIPS += 1
            return await orig(self, *a, **kw)

        setattr(asyncpg.Connection, name, counted)

    for name in ("execute", "executemany", "fetch", "fetchrow", "fetchval"):
        wrap(name)


async def main() -> None:
    dsn, conc = sys.argv[1], int(sys.argv[2])
    mode = sys.argv[3] if len(sys.argv) > 3 else "-"
    if mode != "-":
        z9db.PLAN_CACHE_MODE = None if mode == "default" else mode
    setup_logging("executor", os.environ.get("Z9_LOG_LEVEL", "INFO"))
    if os.environ.get("Z9_BENCH_NO_JOB_NOTIFY") == "1":  # baseline of bench/waiters.py
        strip_job_change_notify()
    noop.register()
    if os.environ.get("Z9_BENCH_CALLGRIND"):
        noop.CALLGRIND = load_callgrind_marks(os.environ["Z9_BENCH_CALLGRIND"])
    settings = Settings(database_url=dsn, executor_concurrency=conc, regions={})
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    line = await reader.readline()
    assert line.strip() == b"go", line
    count_round_trips()
    from z9.common import tracing  # tracing as deployed when the parent sets OTEL_EXPORTER_OTLP_ENDPOINT
    traced = tracing.setup_tracing("executor") if os.environ.get("Z9_BENCH_TRACING") == "1" else None
    profile = None
    if os.environ.get("Z9_BENCH_PROFILE"):
        import cProfile

        profile = cProfile.Profile()
        profile.enable()
    cpu0, t0 = time.process_time(), os.times()
    ex = Executor(settings, ["bench"], client_factory=lambda r: _NoClient())  # type: ignore[arg-type,return-value]
    task = asyncio.create_task(ex.run())
    print("started", flush=True)
    line = await reader.readline()
    cpu, t1 = time.process_time() - cpu0, os.times()
    if noop.CALLGRIND is not None:
        noop.CALLGRIND.z9_cg_stop()
    if profile is not None:
        profile.disable()
        profile.dump_stats(f"{os.environ['Z9_BENCH_PROFILE']}.c{conc}")
    print(json.dumps({"cpu_s": cpu, "user_s": t1.user - t0.user, "sys_s": t1.system - t0.system,
                      "round_trips": ROUND_TRIPS,
                      "steady_cpu_s_per_job": (noop.STEADY[2] - noop.STEADY[1]) / (noop.STEADY[0] - 1)
                      if noop.STEADY[0] > 1 else None,
                      "handler_started": noop.HANDLER_STARTED if os.environ.get("Z9_BENCH_HANDLER_TIMES") else {}}),
          flush=True)
    ex.stop()
    await task
    if traced is not None:
        traced.shutdown()  # flush what is still queued


if __name__ == "__main__":
    # the event loop the executor process runs on (``z9 executor``), where the code measured has one
    from z9.executor import worker

    getattr(worker, "run_event_loop", asyncio.run)(main())
