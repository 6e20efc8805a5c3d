"""One z9 executor process for the drain/latency benchmarks (started by ``bench/run.py``).

Protocol on stdin/stdout (one line each): the parent writes ``go`` → the executor starts (pool,
LISTEN, claims: start-up is inside the measured window) and the child answers ``started``;
the parent writes ``stop`` → the child prints ``{"cpu_s": …}`` (process CPU seconds, user +
system, since ``go``), stops the executor and exits.

Usage: ``executor_child.py DSN CONCURRENCY [PLAN_CACHE_MODE|-]``
"""
from __future__ import annotations

import asyncio
import json
import os
import sys
import time

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


async def main() -> None:
    dsn, conc = sys.argv[1], int(sys.argv[2])
    mode = sys.argv[3] if len(sys.argv) > 3 else "-"
    if mode != "-":
        z9db.PLAN_CACHE_MODE = None if mode == "default" else mode
    setup_logging("executor", os.environ.get("Z9_LOG_LEVEL", "INFO"))
    if os.environ.get("Z9_BENCH_NO_JOB_NOTIFY") == "1":  # baseline of bench/waiters.py
        strip_job_change_notify()
    noop.register()
    settings = Settings(database_url=dsn, executor_concurrency=conc, regions={})
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    line = await reader.readline()
    assert line.strip() == b"go", line
    cpu0 = time.process_time()
    ex = Executor(settings, ["bench"], client_factory=lambda r: _NoClient())  # type: ignore[arg-type,return-value]
    task = asyncio.create_task(ex.run())
    print("started", flush=True)
    line = await reader.readline()
    cpu = time.process_time() - cpu0
    print(json.dumps({"cpu_s": cpu}), flush=True)
    ex.stop()
    await task


if __name__ == "__main__":
    asyncio.run(main())
