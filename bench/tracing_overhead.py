"""What tracing costs a job when it is off (no ``OTEL_EXPORTER_OTLP_ENDPOINT``), and when on.

A ServerCreate attempt against the simulator makes about 45 spans below its job span (4 phases,
4 steps, 4 task waits, ~30 Proxmox calls including task polls) plus the job span, one
``trace_context`` capture when its NewJob is made and one extraction when it is claimed. This
replays that shape (the spans nested as in a real job, inside one asyncio task, each Proxmox
call also copying the context for its thread) and reports microseconds per job:

- ``baseline``: the same loop with one shared ``contextlib.nullcontext`` instead of spans (the
  cheapest ``with`` there is);
- ``off``: z9's tracing helpers with nothing installed (what every service runs by default);
- ``on``: an SDK provider exporting to a no-op exporter through a BatchSpanProcessor (the
  cost of recording, without the network).

Run: ``.venv/bin/python bench/tracing_overhead.py [jobs]`` (default 20000 jobs off, 2000 on).
The job engine's throughput target is per job; compare ``off − baseline`` with it.
"""
from __future__ import annotations

import asyncio
import contextlib
import contextvars
import sys
import time
from typing import Any, Callable

from z9.common import tracing
from z9.common.models import Job

PROXMOX_CALLS_PER_STEP = (4, 4, 4, 4)  # calls (incl. task polls) per step of a ServerCreate
OBSERVE_CALLS, VERIFY_CALLS = 7, 7


def _job() -> Job:
    from datetime import datetime, timezone

    now = datetime.now(timezone.utc)
    return Job(id="job_bench", seq=1, kind="ServerCreate", region="dev-1", tenant_id=None,
               resource_type="server", resource_id="srv_bench", args={}, status="running", attempt=1,
               max_attempts=10, run_after=now, lease_owner="bench", lease_expires_at=now, steps=[],
               error=None, memo={}, trace_context=None, created_at=now, started_at=now,
               finished_at=None, updated_at=now)


async def one_job(job: Job, span: Callable[..., Any], job_span: Callable[[Job], Any]) -> None:
    """One job's worth of spans, nested as the executor nests them."""
    tracing.current_trace_context()  # the API's NewJob
    noop = lambda: None  # noqa: E731

    def call(name: str) -> Any:
        s = span(name, {"http.request.method": "GET", "url.template": name, "z9.region": "dev-1"})
        with s:
            contextvars.copy_context().run(noop)
        return s

    with job_span(job):
        with span("observe", {"z9.phase": "observe"}):
            for _ in range(OBSERVE_CALLS):
                call("GET /cluster/resources")
        with span("plan", {"z9.phase": "plan"}):
            pass
        with span("apply", {"z9.phase": "apply"}):
            for i, n in enumerate(PROXMOX_CALLS_PER_STEP):
                with span(f"step {i}", {"z9.step": str(i)}):
                    call("POST /nodes/{node}/qemu/{vmid}/clone")
                    with span("wait qmclone", {"pve.task.type": "qmclone"}):
                        for _ in range(n - 1):
                            call("GET /nodes/{node}/tasks/{upid}/status")
        with span("verify", {"z9.phase": "verify"}):
            for _ in range(VERIFY_CALLS):
                call("GET /nodes/{node}/qemu/{vmid}/config")


_NULL = contextlib.nullcontext()


def _null(*_a: Any, **_k: Any) -> contextlib.nullcontext:
    return _NULL


async def measure(jobs: int, span: Callable[..., Any], job_span: Callable[[Job], Any]) -> float:
    """Microseconds per job."""
    job = _job()
    for _ in range(min(jobs, 200)):  # warm up
        await one_job(job, span, job_span)
    t0 = time.perf_counter()
    for _ in range(jobs):
        await one_job(job, span, job_span)
    return (time.perf_counter() - t0) / jobs * 1e6


def main(argv: list[str]) -> None:
    jobs = int(argv[1]) if len(argv) > 1 else 20000
    spans_per_job = 1 + 3 + 1 + OBSERVE_CALLS + VERIFY_CALLS + sum(2 + n for n in PROXMOX_CALLS_PER_STEP)
    base = asyncio.run(measure(jobs, _null, _null))
    off = asyncio.run(measure(jobs, tracing.span, tracing.job_span))
    print(f"spans per job: {spans_per_job}")
    print(f"baseline: {base:8.1f} µs/job")
    print(f"off:      {off:8.1f} µs/job  (+{off - base:.1f} µs/job, {(off - base) / spans_per_job:.2f} µs/span)")

    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    class Discard(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = tracing.make_provider("bench", [BatchSpanProcessor(Discard(), max_queue_size=1 << 16)])
    tracing.install(provider)
    on = asyncio.run(measure(max(jobs // 10, 1), tracing.span, tracing.job_span))
    provider.shutdown()
    print(f"on:       {on:8.1f} µs/job  (+{on - base:.1f} µs/job, {(on - base) / spans_per_job:.2f} µs/span)")


if __name__ == "__main__":
    main(sys.argv)
