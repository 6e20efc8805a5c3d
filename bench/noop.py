"""The benchmark's no-op job kind (``BenchNoop``): observe finds nothing, the plan is empty, so
the job succeeds at once. Registered by the benchmark processes only (``register()``), never
shipped as a product kind."""
from __future__ import annotations

import time
from typing import Any

KIND = "BenchNoop"
RECORDS_NOTHING = True
"""``record`` writes nothing: the executor finishes these jobs and claims the next ones in one
statement (services/executor/z9/executor/batching.py)."""

HANDLER_STARTED: dict[str, float] = {}
"""job id → wall clock (``time.time()``) when the handler started (W4 measures to it)."""


CALLGRIND: Any = None
"""bench/callgrind_marks.c loaded (ctypes) when the executor runs under callgrind."""

STEADY: list[float] = [0.0, 0.0, 0.0]
"""[jobs seen, process CPU seconds at the first job's handler, … at the latest one's]: the
executor's CPU per job in the steady state, start-up and the drain's tail left out
(``executor_child.py`` reports (latest − first) / (jobs − 1))."""


async def observe(ctx: Any) -> None:
    """Nothing to observe; notes when the handler started (the first thing a job runs) and the
    process's CPU time then (:data:`STEADY`)."""
    HANDLER_STARTED[ctx.job.id] = time.time()
    cpu = time.process_time()
    if not STEADY[0]:
        STEADY[1] = cpu
        if CALLGRIND is not None:  # count instructions from here (executor_child.py, Z9_BENCH_CALLGRIND)
            CALLGRIND.z9_cg_start()
    STEADY[0] += 1
    STEADY[2] = cpu
    return None


def plan(job: Any, world: Any) -> list[Any]:
    """Nothing to do: the empty plan."""
    return []


async def apply(ctx: Any, world: Any, step: Any) -> None:
    """Never called (the plan is empty)."""
    return None


async def verify(ctx: Any) -> None:
    """Nothing to verify."""
    return None


async def record(conn: Any, ctx: Any, observed: Any) -> None:
    """Nothing to record."""
    return None


async def record_failure(conn: Any, ctx: Any, error: dict[str, Any]) -> None:
    """Nothing to record."""
    return None


def register() -> None:
    """Add this kind to the executor's REGISTRY (in the calling process)."""
    import sys

    from z9.executor.jobs import register as _register

    _register(sys.modules[__name__])
