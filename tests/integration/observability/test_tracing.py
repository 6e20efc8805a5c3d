"""Traces (issue 3): one trace from ``POST /v1/servers`` through every attempt of its job, across
the API and the executor, with the phase, step, Proxmox-call, task-wait and asyncpg spans; the
OTLP exporter really sending when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set, and nothing when not.

The global tracer provider can be set only once per process. This module sets an SDK provider
with an in-memory exporter once (module fixture ``traced``), behind a sampler gate that it closes,
with the instrumentations removed, when the module is done: later test modules then record
nothing. Each test starts with an empty exporter.
"""
from __future__ import annotations

import asyncio
import os
import sys
import textwrap
from typing import Any, AsyncIterator, Iterator

import pytest
from aiohttp import web
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import Decision, SamplingResult
from opentelemetry.trace import SpanKind, StatusCode

from z9.common import store, tracing
from z9.common.settings import Settings
from z9.sim.server import SimServer

from tests.support import REGION, SimAdmin, Stack, free_port, wait_until

ASYNCPG_SCOPE = "opentelemetry.instrumentation.asyncpg"
PHASES = ("observe", "plan", "apply", "verify")


class _Gate:
    """Samples through ``delegate`` while open; drops everything once closed."""

    def __init__(self, delegate: Any):
        self.delegate, self.open = delegate, True

    def should_sample(self, *args: Any, **kw: Any) -> SamplingResult:
        return self.delegate.should_sample(*args, **kw) if self.open else SamplingResult(Decision.DROP)

    def get_description(self) -> str:
        return "Gate"


_EXPORTER = InMemorySpanExporter()
_GATE: _Gate | None = None


@pytest.fixture(scope="module")
def traced(sim_server: SimServer) -> Iterator[InMemorySpanExporter]:
    """The SDK provider (set once per process), open for this module. Depends on the simulator
    so that its aiohttp app exists before the server instrumentation wraps new apps."""
    global _GATE
    if _GATE is None:
        provider = tracing.make_provider("test", [SimpleSpanProcessor(_EXPORTER)])
        _GATE = provider.sampler = _Gate(provider.sampler)
        tracing.install(provider)
    else:  # the module ran before in this process: the provider is already global
        tracing.install(trace.get_tracer_provider())
    _GATE.open = True
    yield _EXPORTER
    _GATE.open = False
    tracing.uninstall_instrumentation()
    _EXPORTER.clear()


@pytest.fixture
def spans(traced: InMemorySpanExporter) -> InMemorySpanExporter:
    traced.clear()
    return traced


# ------------------------------------------------------------------------------ helpers


def _trace(exporter: InMemorySpanExporter, trace_id: int) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.context.trace_id == trace_id]


def _by_id(spans: list[ReadableSpan]) -> dict[int, ReadableSpan]:
    return {s.context.span_id: s for s in spans}


def _descends(span: ReadableSpan, ancestor: ReadableSpan, index: dict[int, ReadableSpan]) -> bool:
    cur = span
    while cur.parent is not None:
        if cur.parent.span_id == ancestor.context.span_id:
            return True
        cur = index.get(cur.parent.span_id)
        if cur is None:
            return False
    return False


def _children(span: ReadableSpan, spans: list[ReadableSpan]) -> list[ReadableSpan]:
    return [s for s in spans if s.parent is not None and s.parent.span_id == span.context.span_id]


def _server_span(exporter: InMemorySpanExporter, name: str) -> ReadableSpan:
    found = [s for s in exporter.get_finished_spans() if s.name == name and s.kind == SpanKind.SERVER]
    assert len(found) == 1, [s.name for s in exporter.get_finished_spans()]
    return found[0]


async def _job_spans(exporter: InMemorySpanExporter, job_id: str, count: int) -> list[ReadableSpan]:
    """The job spans of ``job_id`` by attempt, once ``count`` have ended (a job span ends just
    after its job's final write, so right after the API shows the job finished)."""
    def ended() -> list | None:
        found = [s for s in exporter.get_finished_spans() if s.attributes.get("job.id") == job_id]
        return sorted(found, key=lambda s: s.attributes["job.attempt"]) if len(found) >= count else None
    return await wait_until(ended, 10, f"{count} job span(s) of {job_id}")


def _traceparent_trace_id(ctx: dict[str, Any] | None) -> int:
    assert ctx and "traceparent" in ctx, ctx
    return int(ctx["traceparent"].split("-")[1], 16)


# ------------------------------------------------------------------------------ one trace


async def test_create_request_and_its_job_are_one_trace(stack: Stack, spans: InMemorySpanExporter) -> None:
    server, job = await stack.create_server("traced-1")
    done = await stack.wait_job(job["id"])
    assert done["status"] == "succeeded", done
    [job_span] = await _job_spans(spans, job["id"], 1)

    http = _server_span(spans, "POST /v1/servers")
    assert http.attributes.get("http.route") == "/v1/servers"
    tid = http.context.trace_id
    everything = _trace(spans, tid)
    index = _by_id(everything)

    # The row carries the request's context; the job span continues it.
    row = await store.job_get(stack.pool, job["id"])
    assert _traceparent_trace_id(row.trace_context) == tid
    assert job_span.context.trace_id == tid and _descends(job_span, http, index)
    assert job_span.name == "job ServerCreate" and job_span.kind == SpanKind.CONSUMER
    assert dict(job_span.attributes) == {
        "job.id": job["id"], "job.kind": "ServerCreate", "job.region": REGION, "job.attempt": 1,
        "z9.resource.id": server["id"], "z9.resource.type": "server", "job.outcome": "succeeded"}
    assert job_span.status.status_code != StatusCode.ERROR

    # The four phases, in order, children of the job span.
    phases = sorted((s for s in _children(job_span, everything) if s.name in PHASES), key=lambda s: s.start_time)
    assert [p.name for p in phases] == list(PHASES)
    apply = phases[2]

    # One span per step the job recorded, under apply, each with its Proxmox calls below it.
    step_names = [s["name"] for s in done["steps"]]
    assert step_names, done
    steps = sorted(_children(apply, everything), key=lambda s: s.start_time)
    assert [s.name for s in steps] == [f"step {n}" for n in step_names]
    clone_step = next(s for s in steps if s.name == "step clone")
    clone_calls = [s for s in everything if s.name == "POST /nodes/{node}/qemu/{vmid}/clone"]
    assert len(clone_calls) == 1 and _descends(clone_calls[0], clone_step, index)
    call = clone_calls[0]
    assert call.kind == SpanKind.CLIENT
    assert call.attributes["http.request.method"] == "POST"
    assert call.attributes["url.template"] == "/nodes/{node}/qemu/{vmid}/clone"
    assert call.attributes["http.response.status_code"] == 200
    waits = [s for s in everything if s.name == "wait qmclone"]
    assert len(waits) == 1 and _descends(waits[0], clone_step, index)
    assert waits[0].attributes["pve.task.exitstatus"] == "OK"
    polls = [s for s in _children(waits[0], everything) if s.name == "GET /nodes/{node}/tasks/{upid}/status"]
    assert polls, "the task wait polls the task's status"
    observe_calls = {s.name for s in everything if _descends(s, phases[0], index)}
    assert "GET /cluster/resources" in observe_calls

    # asyncpg: the API's inserts under the request span, the job's writes under the job span.
    db = [s for s in everything if s.instrumentation_scope.name == ASYNCPG_SCOPE]
    assert any(_descends(s, http, index) and not _descends(s, job_span, index)
               and "INSERT INTO jobs" in s.attributes.get("db.statement", "") for s in db)
    assert any(_descends(s, job_span, index) for s in db)
    # Nothing recorded as an error on a clean run, except task polls answered "no such task"
    # (400: a task not yet visible on its node, tolerated by the waiter) and the guest agent's
    # "not running" while the new VM boots (500, tolerated by verify's wait for the guest).
    errors = [(s.name, s.attributes.get("http.response.status_code"), s.status.description)
              for s in everything if s.status.status_code == StatusCode.ERROR]
    assert all((e[0] == "GET /nodes/{node}/tasks/{upid}/status" and e[1] == 400 and "no such task" in e[2])
               or ("/agent/" in e[0] and e[1] == 500 and "QEMU guest agent is not running" in e[2])
               for e in errors), errors


async def test_a_retried_job_keeps_both_attempts_in_the_request_trace(stack: Stack, sim: SimAdmin,
                                                                       spans: InMemorySpanExporter) -> None:
    # a 500 that is an answer (a flock timeout would be tried again within the call)
    await sim.fault(method="POST", path=r"^/nodes/[^/]+/qemu/\d+/clone$", action="error", status=500,
                    reason="simulated busy node", times=1)
    server, job = await stack.create_server("traced-retry")
    done = await stack.wait_job(job["id"])
    assert done["status"] == "succeeded" and done["attempt"] == 2, done
    first, second = await _job_spans(spans, job["id"], 2)

    http = _server_span(spans, "POST /v1/servers")
    tid = http.context.trace_id
    everything = _trace(spans, tid)
    index = _by_id(everything)
    for attempt, js in enumerate((first, second), start=1):
        assert js.context.trace_id == tid and _descends(js, http, index)
        assert js.attributes["job.attempt"] == attempt
    assert first.context.span_id != second.context.span_id

    # The first attempt: the failed call, its step and the job span carry the error and its class.
    assert first.attributes["job.outcome"] == "retry"
    assert first.status.status_code == StatusCode.ERROR
    assert first.attributes["z9.error_class"] == "temporary"
    assert any(e.name == "exception" for e in first.events)
    failed_call = next(s for s in everything if s.name == "POST /nodes/{node}/qemu/{vmid}/clone"
                       and _descends(s, first, index))
    assert failed_call.attributes["http.response.status_code"] == 500
    assert failed_call.status.status_code == StatusCode.ERROR
    assert failed_call.attributes["z9.error_class"] == "temporary"
    failed_step = next(s for s in everything if s.name == "step clone" and _descends(s, first, index))
    assert failed_step.status.status_code == StatusCode.ERROR

    # The second attempt succeeded in the same trace.
    assert second.attributes["job.outcome"] == "succeeded"
    assert second.status.status_code != StatusCode.ERROR
    assert {s.name for s in _children(second, everything)} >= set(PHASES)


async def test_delete_and_cancel_jobs_carry_their_request_trace(stack: Stack, spans: InMemorySpanExporter) -> None:
    server, job = await stack.create_server("traced-del")
    assert (await stack.wait_job(job["id"]))["status"] == "succeeded"
    status, out = await stack.call("DELETE", f"/servers/{server['id']}")
    assert status == 202, out
    stop_job = out["job"]["id"]
    assert (await stack.wait_job(stop_job))["status"] == "succeeded"
    status, out = await stack.call("POST", f"/servers/{server['id']}/actions/cancel-deletion")
    assert status == 202, out
    start_job = out["job"]["id"]
    assert (await stack.wait_job(start_job))["status"] == "succeeded"

    for route, job_id in (("DELETE /v1/servers/{id}", stop_job),
                          ("POST /v1/servers/{id}/actions/cancel-deletion", start_job)):
        http = _server_span(spans, route)
        row = await store.job_get(stack.pool, job_id)
        assert _traceparent_trace_id(row.trace_context) == http.context.trace_id, route
        [js] = await _job_spans(spans, job_id, 1)
        assert js.context.trace_id == http.context.trace_id
        assert _descends(js, http, _by_id(_trace(spans, http.context.trace_id)))


async def test_a_client_traceparent_is_continued(api: Stack, spans: InMemorySpanExporter) -> None:
    tid, sid = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    body = {"name": "traced-tp", "region": REGION, "image": "debian-12", "cores": 1, "memory_mib": 512, "disk_gib": 10}
    status, out = await api.call("POST", "/servers", json=body, headers={"traceparent": f"00-{tid}-{sid}-01"})
    assert status == 202, out
    http = _server_span(spans, "POST /v1/servers")
    assert format(http.context.trace_id, "032x") == tid and format(http.parent.span_id, "016x") == sid
    row = await store.job_get(api.pool, out["job"]["id"])
    assert row.trace_context["traceparent"] == f"00-{tid}-{format(http.context.span_id, '016x')}-01"


async def test_bulk_inserted_jobs_carry_the_current_context(pool: Any, spans: InMemorySpanExporter) -> None:
    """``job_insert_many`` (the reaper's) writes ``trace_context``: the current span's, none
    outside a span."""
    new = lambda: store.NewJob(kind="ServerDelete", region=REGION)  # noqa: E731 - made where it is used
    async with pool.acquire() as conn, conn.transaction():
        outside = await store.job_insert_many(conn, [new()], notify=False)
        with tracing.span("reaper pass") as s:
            inside = await store.job_insert_many(conn, [new(), new()], notify=False)
    assert outside[0].trace_context is None
    want = format(s.get_span_context().span_id, "016x")
    for job in inside:
        stored = await store.job_get(pool, job.id)
        assert _traceparent_trace_id(stored.trace_context) == s.get_span_context().trace_id
        assert stored.trace_context["traceparent"].split("-")[2] == want


async def test_proxmox_calls_run_with_their_span_current_in_the_thread(settings: Settings,
                                                                      spans: InMemorySpanExporter) -> None:
    """proxmoxer runs in a thread pool: the call's span must be current there too (log lines
    read their trace and span ids from it)."""
    from z9.executor.proxmox import ProxmoxClient

    client = ProxmoxClient(REGION, settings.regions[REGION])
    try:
        with tracing.span("outer") as outer:
            seen = await client._call("GET /cluster/nextid", "probe",
                                      lambda: trace.get_current_span().get_span_context())
    finally:
        client.close()
    [call] = [s for s in spans.get_finished_spans() if s.name == "GET /cluster/nextid"]
    assert seen.span_id == call.context.span_id
    assert call.parent.span_id == outer.get_span_context().span_id


# ------------------------------------------------------------------------------ setup_tracing


def _child_env(**over: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(over)
    return env


async def _run_python(code: str, env: dict[str, str]) -> str:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", textwrap.dedent(code), env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, out.decode()
    return out.decode()


class _Receiver:
    """A tiny OTLP/HTTP trace receiver: ``POST /v1/traces`` with a protobuf body."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, str]] = []  # (service.name, span name)
        self.content_types: list[str] = []

    async def handle(self, request: web.Request) -> web.Response:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest, ExportTraceServiceResponse)

        self.content_types.append(request.content_type)
        msg = ExportTraceServiceRequest.FromString(await request.read())
        for rs in msg.resource_spans:
            service = next((a.value.string_value for a in rs.resource.attributes if a.key == "service.name"), "")
            for ss in rs.scope_spans:
                self.spans.extend((service, s.name) for s in ss.spans)
        return web.Response(body=ExportTraceServiceResponse().SerializeToString(),
                            content_type="application/x-protobuf")


@pytest.fixture
async def receiver() -> AsyncIterator[tuple[_Receiver, int]]:
    rec = _Receiver()
    app = web.Application()
    app.router.add_post("/v1/traces", rec.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield rec, port
    finally:
        await runner.cleanup()


async def test_otlp_export_sends_spans_to_the_endpoint(receiver: tuple[_Receiver, int]) -> None:
    rec, port = receiver
    out = await _run_python("""
        from z9.common import tracing
        t = tracing.setup_tracing("executor")
        assert t.enabled and tracing.active()
        with tracing.span("probe span", {"k": "v"}):
            pass
        t.shutdown()  # flushes the batch
        print("ok")
    """, _child_env(OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{port}"))
    assert "ok" in out
    assert ("z9-executor", "probe span") in rec.spans, rec.spans
    assert rec.content_types == ["application/x-protobuf"]


async def test_without_an_endpoint_nothing_is_installed_or_exported(receiver: tuple[_Receiver, int]) -> None:
    rec, port = receiver
    out = await _run_python("""
        import sys
        from opentelemetry import trace
        from z9.common import tracing
        t = tracing.setup_tracing("api")
        assert not t.enabled and not tracing.active()
        assert not isinstance(trace.get_tracer_provider(), __import__("opentelemetry.sdk.trace").sdk.trace.TracerProvider)
        with tracing.span("probe span") as s:
            assert not s.is_recording()
            assert tracing.current_trace_context() is None
        assert not any(m.startswith("opentelemetry.exporter") for m in sys.modules)
        assert not any(m.startswith("opentelemetry.instrumentation.asyncpg") for m in sys.modules)
        t.shutdown()
        t.shutdown()
        print("ok")
    """, _child_env(OTEL_EXPORTER_OTLP_TRACES_ENDPOINT="", OTEL_BSP_SCHEDULE_DELAY="1"))
    assert "ok" in out
    assert rec.spans == []


async def test_unsupported_protocol_is_refused_at_startup() -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "z9", "scheduler", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env=_child_env(OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9", OTEL_EXPORTER_OTLP_PROTOCOL="http/json",
                       Z9_DATABASE_URL="postgresql://nobody@127.0.0.1:9/none"))
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 2 and b"OTEL_EXPORTER_OTLP_PROTOCOL" in err, err


def test_sdk_disabled_wins_over_an_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    assert tracing.export_configured()
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    assert not tracing.export_configured()
    assert not tracing.setup_tracing("reaper").enabled



def test_protocol_picks_the_exporter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_PROTOCOL", raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", raising=False)
    assert tracing.otlp_protocol() == "http/protobuf"
    http = tracing.make_exporter()
    assert type(http).__module__.startswith("opentelemetry.exporter.otlp.proto.http")
    http.shutdown()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    grpc = tracing.make_exporter()  # connects lazily: nothing is sent here
    assert type(grpc).__module__.startswith("opentelemetry.exporter.otlp.proto.grpc")
    grpc.shutdown()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf")  # the traces-specific one wins
    assert tracing.otlp_protocol() == "http/protobuf"


@pytest.mark.settings(trace_uneventful_ratio=1.0)  # the start of a running server has nothing to do
@pytest.mark.parametrize("bad", ["garbage", [1, 2], {"traceparent": 5}, {"traceparent": {"a": 1}},
                                 {"traceparent": "00-zz-yy-01"}])
async def test_a_malformed_stored_trace_context_does_not_stop_the_job(stack: Stack, spans: InMemorySpanExporter,
                                                                        bad: Any) -> None:
    """A job row whose ``trace_context`` is not a ``{str: str}`` W3C carrier runs normally, in a
    trace of its own (it used to crash the job span before the job ran, until the lease expired)."""
    server, job = await stack.create_server("traced-bad")
    assert (await stack.wait_job(job["id"]))["status"] == "succeeded"
    async with stack.pool.acquire() as conn, conn.transaction():
        start = await store.job_insert(conn, store.NewJob(
            kind="ServerStart", region=REGION, tenant_id=stack.tenant_id,
            resource_type="server", resource_id=server["id"], trace_context=bad))
    done = await stack.wait_job(start.id, timeout_s=20)
    assert done["status"] == "succeeded" and done["attempt"] == 1, done
    [js] = await _job_spans(spans, start.id, 1)
    assert js.parent is None  # a new trace


@pytest.mark.settings(deletion_buffer_s=0.3)
async def test_the_final_delete_continues_the_delete_request_trace(stack: Stack, spans: InMemorySpanExporter) -> None:
    """The reaper's ServerDelete (after the buffer) is in the trace of ``DELETE /v1/servers/{id}``."""
    server, job = await stack.create_server("traced-gone")
    assert (await stack.wait_job(job["id"]))["status"] == "succeeded"
    status, out = await stack.call("DELETE", f"/servers/{server['id']}")
    assert status == 202, out

    async def ready() -> bool:
        return bool((await stack.server(server["id"]))["status"] == "deleted")
    await wait_until(ready, 20, '(await stack.server(server["id"]))["status"] == "deleted"')
    status, jobs = await stack.call("GET", f"/jobs?resource_id={server['id']}")
    [final] = [j for j in jobs["jobs"] if j["kind"] == "ServerDelete"]
    assert final["status"] == "succeeded", final
    http = _server_span(spans, "DELETE /v1/servers/{id}")
    row = await store.job_get(stack.pool, final["id"])
    assert _traceparent_trace_id(row.trace_context) == http.context.trace_id
    [js] = await _job_spans(spans, final["id"], 1)
    assert js.context.trace_id == http.context.trace_id
    # Its verify reads the VM gone (Proxmox answers 500 "does not exist"): an answer, not a failed
    # call — no ERROR span in a delete that succeeded (n14user: every delete left one).
    everything = _trace(spans, js.context.trace_id)
    index = _by_id(everything)
    mine = [s for s in everything if _descends(s, js, index)]
    gone = [s for s in mine if s.attributes.get("z9.answer") == "VmMissing"]
    assert gone and all(s.attributes["http.response.status_code"] == 500 for s in gone)
    errors = [(s.name, s.status.description) for s in mine if s.status.status_code == StatusCode.ERROR
              and not (s.name == "GET /nodes/{node}/tasks/{upid}/status" and "no such task" in (s.status.description or ""))]
    assert not errors, errors


# ------------------------------------------------------------------------------ uneventful attempts


async def _start_running_server(stack: Stack, name: str) -> tuple[dict[str, Any], str]:
    """A created (running) server and the id of a ServerStart job for it, which finds nothing to do."""
    server, job = await stack.create_server(name)
    assert (await stack.wait_job(job["id"]))["status"] == "succeeded"
    async with stack.pool.acquire() as conn, conn.transaction():
        start = await store.job_insert(conn, store.NewJob(
            kind="ServerStart", region=REGION, tenant_id=stack.tenant_id,
            resource_type="server", resource_id=server["id"]))
    done = await stack.wait_job(start.id, timeout_s=20)
    assert done["status"] == "succeeded" and done["steps"] == [], done
    return server, start.id


@pytest.mark.settings(trace_uneventful_ratio=0.0)
async def test_an_uneventful_attempt_is_not_exported_unless_sampled(stack: Stack,
                                                                     spans: InMemorySpanExporter) -> None:
    """Issue 14: an attempt that succeeds with nothing to do leaves no span at all (its phase,
    Proxmox-call and query spans included) at ``trace_uneventful_ratio`` 0, and is exported whole,
    phases under its job span, at 1."""
    _, quiet = await _start_running_server(stack, "traced-quiet")
    # a job span ends just after its final write: once the executor's task of the job is over
    await wait_until(lambda: quiet not in stack.services["executor"].inflight, 10, "the quiet attempt's task to end")
    assert not [s for s in spans.get_finished_spans() if s.attributes.get("job.id") == quiet]
    created = [s for s in spans.get_finished_spans() if s.name == "job ServerCreate"]
    assert len(created) == 1  # the create had something to do: exported
    everything = spans.get_finished_spans()
    index = _by_id(everything)
    # nothing of the quiet attempt: every span left is the create's, the API's or the simulator's
    assert all(not s.name.startswith(("observe", "plan", "verify")) or _descends(s, created[0], index)
               for s in everything)

    await stack.restart_service("executor", trace_uneventful_ratio=1.0)
    spans.clear()
    _, sampled = await _start_running_server(stack, "traced-sampled")
    [js] = await _job_spans(spans, sampled, 1)
    everything = _trace(spans, js.context.trace_id)
    children = sorted(_children(js, everything), key=lambda s: s.start_time)
    assert [c.name for c in children] == ["observe", "plan", "verify"]
    assert all(js.start_time <= c.start_time <= c.end_time <= js.end_time for c in children)
    assert children[0].end_time <= children[1].start_time <= children[1].end_time <= children[2].start_time
    observe_calls = [s for s in everything if _descends(s, children[0], _by_id(everything))]
    assert observe_calls and all(s.kind == SpanKind.CLIENT for s in observe_calls)


@pytest.mark.settings(trace_uneventful_ratio=0.0)
async def test_an_eventful_attempt_keeps_the_spans_recorded_before_its_plan(stack: Stack, sim: SimAdmin,
                                                                           spans: InMemorySpanExporter) -> None:
    """A stop of a running server has something to do: its observe and plan spans (kept as records
    while the attempt was deferred) are exported with their own times under the job span, before
    apply; the queries of the attempt are traced from apply on. (A failed or retried attempt is
    eventful too: test_a_retried_job_keeps_both_attempts_in_the_request_trace runs at the default
    ratio.)"""
    server, job = await stack.create_server("traced-stop")
    assert (await stack.wait_job(job["id"]))["status"] == "succeeded"
    status, out = await stack.call("POST", f"/servers/{server['id']}/actions/shutdown")
    assert status == 202, out
    assert (await stack.wait_job(out["job"]["id"]))["status"] == "succeeded"
    [js] = await _job_spans(spans, out["job"]["id"], 1)
    everything = _trace(spans, js.context.trace_id)
    index = _by_id(everything)
    phases = sorted((s for s in _children(js, everything) if s.name in PHASES), key=lambda s: s.start_time)
    assert [p.name for p in phases] == list(PHASES)
    assert all(a.end_time <= b.start_time for a, b in zip(phases, phases[1:]))
    db = [s for s in everything if s.instrumentation_scope.name == ASYNCPG_SCOPE and _descends(s, js, index)]
    assert db and all(not _descends(s, phases[0], index) for s in db)  # observe's queries: not traced
    assert all(s.start_time >= phases[1].end_time for s in db)

