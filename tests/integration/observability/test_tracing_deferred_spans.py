"""deferred job spans (tracing.job_span / span / materialize) under failure, cancellation,
a stored request context, a materialize() with a record open, and one made in a child task."""
from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace
from typing import Any

import pytest
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from z9.common import tracing
from z9.common.errors import TemporaryError

from tests.integration.observability.test_tracing import spans, traced  # noqa: F401  (fixtures: the in-memory exporter)


def _job(trace_context: Any = None) -> Any:
    return SimpleNamespace(id="j-1", kind="StartServer", region="r1", attempt=1, resource_id=None,
                           resource_type=None, trace_context=trace_context)


def _named(exporter: InMemorySpanExporter) -> dict[str, Any]:
    return {s.name: s for s in exporter.get_finished_spans()}


def _parent(s: Any) -> int | None:
    return s.parent.span_id if s.parent is not None else None


async def test_an_exception_in_a_phase_exports_the_attempt_with_its_parents(spans: InMemorySpanExporter) -> None:
    with pytest.raises(TemporaryError):
        with tracing.job_span(_job(), 0.0):
            with tracing.span("observe"):
                with tracing.span("GET /x"):
                    raise TemporaryError("boom")
    got = _named(spans)
    assert set(got) == {"job StartServer", "observe", "GET /x"}
    job, obs, get = got["job StartServer"], got["observe"], got["GET /x"]
    assert _parent(obs) == job.context.span_id and _parent(get) == obs.context.span_id
    assert {s.context.trace_id for s in got.values()} == {job.context.trace_id}
    assert all(s.status.status_code == StatusCode.ERROR for s in got.values())


async def test_a_job_cancelled_mid_phase_is_exported_and_leaves_the_context_as_it_was(
        spans: InMemorySpanExporter) -> None:
    started = asyncio.Event()

    async def attempt() -> None:
        with tracing.job_span(_job(), 0.0):
            with tracing.span("observe"):
                started.set()
                await asyncio.sleep(10)

    before = otel_context.get_current()
    task = asyncio.create_task(attempt())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    got = _named(spans)
    assert set(got) == {"job StartServer", "observe"}
    assert got["job StartServer"].attributes["z9.error_class"] == "cancelled"
    assert otel_context.get_current() is before


async def test_an_api_created_job_is_a_child_of_its_request(spans: InMemorySpanExporter) -> None:
    with trace.get_tracer("t").start_as_current_span("POST /v1/servers") as req:
        stored = tracing.current_trace_context()
    assert stored
    with tracing.job_span(_job(stored), 0.0):
        with tracing.span("plan"):
            pass
        tracing.materialize()
        with tracing.span("apply"):
            pass
    got = _named(spans)
    job = got["job StartServer"]
    assert job.context.trace_id == req.get_span_context().trace_id
    assert _parent(job) == req.get_span_context().span_id
    assert _parent(got["plan"]) == _parent(got["apply"]) == job.context.span_id
    assert trace.get_current_span() is trace.INVALID_SPAN


async def test_materialize_with_a_record_open_keeps_later_siblings_under_the_job(
        spans: InMemorySpanExporter) -> None:
    with tracing.job_span(_job(), 0.0):
        with tracing.span("plan"):
            tracing.materialize()  # something to do, found while the plan span is open
            with tracing.span("inner"):
                pass
        with tracing.span("apply"):
            with tracing.span("step x"):
                pass
    got = _named(spans)
    job = got["job StartServer"]
    assert _parent(got["inner"]) == got["plan"].context.span_id
    assert _parent(got["apply"]) == job.context.span_id  # not a child of the ended plan span
    assert _parent(got["step x"]) == got["apply"].context.span_id
    assert trace.get_current_span() is trace.INVALID_SPAN


async def test_materialize_in_a_child_task_does_not_detach_a_foreign_token(
        spans: InMemorySpanExporter, caplog: pytest.LogCaptureFixture) -> None:
    async def provision() -> None:
        tracing.materialize()  # e.g. a step of a gather() found its plan non-empty
        with tracing.span("GET /y"):
            pass

    with caplog.at_level(logging.ERROR):
        with tracing.job_span(_job(), 0.0):
            await asyncio.gather(provision())
    assert "Failed to detach context" not in caplog.text
    got = _named(spans)
    assert _parent(got["GET /y"]) == got["job StartServer"].context.span_id
    assert trace.get_current_span() is trace.INVALID_SPAN


async def test_spans_in_the_proxmox_thread_of_a_deferred_attempt_land_in_it(spans: InMemorySpanExporter) -> None:
    import contextvars

    def in_thread() -> None:
        with tracing.span("thread work"):
            pass

    loop = asyncio.get_running_loop()
    with tracing.job_span(_job(), 0.0):
        with tracing.span("GET /z"):
            await loop.run_in_executor(None, contextvars.copy_context().run, in_thread)
        tracing.materialize()
    got = _named(spans)
    assert _parent(got["thread work"]) == got["GET /z"].context.span_id
    assert _parent(got["GET /z"]) == got["job StartServer"].context.span_id


async def test_an_uneventful_attempt_is_dropped(spans: InMemorySpanExporter) -> None:
    with tracing.job_span(_job(), 0.0) as s:
        with tracing.span("observe"):
            pass
        s.set_attribute("job.outcome", "succeeded")
    assert spans.get_finished_spans() == ()
    with tracing.job_span(_job(), 0.0) as s:
        s.set_attribute("job.outcome", "retry")
    assert set(_named(spans)) == {"job StartServer"}


async def test_an_error_recorded_after_a_childs_materialize_marks_the_job(spans: InMemorySpanExporter) -> None:
    async def provision() -> None:
        tracing.materialize()

    with tracing.job_span(_job(), 0.0) as s:
        await asyncio.gather(provision())
        with tracing.span("verify"):
            pass
        tracing.record_error(TemporaryError("later"))  # what run_job does for a retry
        s.set_attribute("job.outcome", "retry")
    got = _named(spans)
    assert got["job StartServer"].status.status_code == StatusCode.ERROR
    assert _parent(got["verify"]) == got["job StartServer"].context.span_id
