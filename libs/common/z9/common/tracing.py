"""OpenTelemetry traces: one trace from an API request through every job attempt it caused.

How a trace crosses processes. The API's request span (aiohttp server instrumentation, named
after the route template, e.g. ``POST /v1/servers``) is the current span when the handler builds
its :class:`~z9.common.store.NewJob`; the W3C ``traceparent``/``tracestate`` of that span go into
the job row (``jobs.trace_context``, via :func:`current_trace_context`). The executor's job span
(``job <Kind>``) of every attempt is a child of that stored context, so retries — on any
executor — land in the same trace, each attempt one job span. Below it: one span per phase
(``observe``, ``plan``, ``apply``, ``verify``), one per step (``step <name>``), one per Proxmox
call (``GET /nodes/{node}/qemu/{vmid}/config``), one per task wait (``wait <UPID type>``), and
the asyncpg instrumentation's query spans.

On or off. :func:`setup_tracing` exports by OTLP only when ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) is set and ``OTEL_SDK_DISABLED`` is not ``true``;
otherwise it installs nothing: no SDK provider, no instrumentation, and the spans below are
the API's non-recording no-op spans (see ``bench/tracing_overhead.py`` for their cost).
The protocol is ``http/protobuf`` unless ``OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL`` is ``grpc``;
every other standard ``OTEL_*`` variable (headers, timeout, compression, certificates,
``OTEL_BSP_*`` batching, ``OTEL_TRACES_SAMPLER``, ``OTEL_SERVICE_NAME``,
``OTEL_RESOURCE_ATTRIBUTES``) is read by the SDK itself.

Uneventful job attempts are not exported (issue 14: with every attempt traced, OTLP export cost
a no-op drain(16) about two thirds of its throughput). A job attempt's spans are first kept as
plain records (:func:`job_span`): no SDK span, no export, the asyncpg instrumentation suppressed.
As soon as the attempt has something to do (a non-empty plan: :func:`materialize`), the records
become real spans with their recorded times and everything after is traced as usual. An attempt
that ends with nothing done and no error — a job run the second time, a periodic observe that
found everything as it should be — is dropped, except a ``trace_uneventful_ratio`` share of them
(``Z9_TRACE_UNEVENTFUL_RATIO``, 0.01). A failed, retried, snoozed or lost attempt is always
exported whole. The queries of observe and plan of an attempt are not traced (suppressed while
deferred); its Proxmox calls are.

Database queries that run outside any span (the scheduler's passes, the executor's claim
polls, LISTEN health checks) would each start a one-span trace every second or so; the
sampler drops them (:class:`SkipOrphanQueries`).
"""
from __future__ import annotations

import asyncio
import contextvars
import logging
import os
import random
import socket
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, ContextManager, Iterator, Mapping, Sequence

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.context import _SUPPRESS_INSTRUMENTATION_KEY
from opentelemetry.trace import SpanKind, Status, StatusCode

log = logging.getLogger("z9.tracing")

_tracer = trace.get_tracer("z9")  # a proxy: follows the global provider once one is set
_active = False  # True once this process installed an SDK provider (setup_tracing or install)

# Paths of the aiohttp server whose requests are not traced unless
# OTEL_PYTHON_AIOHTTP_SERVER_EXCLUDED_URLS says otherwise (health checks and scrapes).
DEFAULT_EXCLUDED_URLS = "/healthz$,/metrics$"


# ------------------------------------------------------------------------------ setup


def _env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() == "true"


def export_configured() -> bool:
    """True when the environment asks for OTLP export: ``OTEL_EXPORTER_OTLP_ENDPOINT`` or
    ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` set (non-empty) and ``OTEL_SDK_DISABLED`` not true."""
    if _env_true("OTEL_SDK_DISABLED"):
        return False
    return bool(os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
                or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip())


def otlp_protocol() -> str:
    """``grpc`` or ``http/protobuf`` (the default), from ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL``,
    else ``OTEL_EXPORTER_OTLP_PROTOCOL``. Raises ValueError for another value (``http/json`` is
    not supported by the installed exporters)."""
    proto = (os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "").strip()
             or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "").strip() or "http/protobuf")
    if proto not in ("grpc", "http/protobuf"):
        raise ValueError(f"OTEL_EXPORTER_OTLP_PROTOCOL={proto!r}: z9 exports traces by 'http/protobuf' or 'grpc'")
    return proto


def make_exporter() -> Any:
    """The OTLP span exporter for :func:`otlp_protocol`, configured by the standard
    ``OTEL_EXPORTER_OTLP_*`` variables (read by the exporter)."""
    if otlp_protocol() == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    return OTLPSpanExporter()


def make_provider(service: str, processors: Sequence[Any] = ()) -> Any:
    """An SDK ``TracerProvider`` for service ``service`` (``service.name`` = ``z9-<service>``
    unless ``OTEL_SERVICE_NAME`` is set; ``service.instance.id`` = ``host:pid``) with
    ``processors`` added. Its sampler is the one
    ``OTEL_TRACES_SAMPLER`` names (parent-based always-on by default), wrapped in
    :class:`SkipOrphanQueries`."""
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider

    attrs = {"service.instance.id": f"{socket.gethostname()}:{os.getpid()}"}
    if not os.environ.get("OTEL_SERVICE_NAME"):
        attrs[SERVICE_NAME] = f"z9-{service}"
    provider = TracerProvider(resource=Resource.create(attrs))
    provider.sampler = SkipOrphanQueries(provider.sampler)  # before any tracer is made from it
    for p in processors:
        provider.add_span_processor(p)
    return provider


def install(provider: Any) -> None:
    """Make ``provider`` the process's global tracer provider and turn on the asyncpg and
    aiohttp server instrumentations (the latter wraps every ``aiohttp.web.Application`` made
    after this call, so call it before the app factory). The global provider can be set only
    once per process: a second call leaves the first provider in place (the SDK logs a warning)."""
    global _active
    from opentelemetry.instrumentation.aiohttp_server import AioHttpServerInstrumentor
    from opentelemetry.instrumentation.asyncpg import AsyncPGInstrumentor

    os.environ.setdefault("OTEL_PYTHON_AIOHTTP_SERVER_EXCLUDED_URLS", DEFAULT_EXCLUDED_URLS)
    trace.set_tracer_provider(provider)
    AsyncPGInstrumentor().instrument()
    AioHttpServerInstrumentor().instrument()
    _active = True


def uninstall_instrumentation() -> None:
    """Undo the instrumentations of :func:`install` (the global provider stays: the API
    cannot unset it). For tests."""
    global _active
    from opentelemetry.instrumentation.aiohttp_server import AioHttpServerInstrumentor
    from opentelemetry.instrumentation.asyncpg import AsyncPGInstrumentor

    AsyncPGInstrumentor().uninstrument()
    AioHttpServerInstrumentor().uninstrument()
    _active = False


@dataclass
class Tracing:
    """What :func:`setup_tracing` set up. ``provider`` is None when tracing is off."""

    service: str
    provider: Any = None

    @property
    def enabled(self) -> bool:
        return self.provider is not None

    def shutdown(self) -> None:
        """Flush the spans still queued (bounded by ``OTEL_BSP_EXPORT_TIMEOUT``) and stop the
        exporter. Safe to call when tracing is off, and more than once."""
        if self.provider is not None:
            provider, self.provider = self.provider, None
            try:
                provider.shutdown()
            except Exception:  # exporting is best effort; never fail a service's exit over it
                log.warning("flushing traces failed", exc_info=True)


def setup_tracing(service: str) -> Tracing:
    """Set up tracing for one z9 process named ``service`` (``api``, ``executor``, ...).

    With an OTLP endpoint configured (:func:`export_configured`): an SDK provider
    (:func:`make_provider`) exporting through a ``BatchSpanProcessor`` and the exporter of
    :func:`make_exporter`, installed globally with the asyncpg and aiohttp server
    instrumentations (:func:`install`). Otherwise nothing is installed and spans are no-ops.
    Call :meth:`Tracing.shutdown` on exit to flush. Raises ValueError for an unsupported
    ``OTEL_EXPORTER_OTLP_PROTOCOL``.
    """
    if not export_configured():
        return Tracing(service)
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = make_provider(service, [BatchSpanProcessor(make_exporter())])
    install(provider)
    log.info("tracing: exporting spans of z9-%s by OTLP (%s)", service, otlp_protocol())
    return Tracing(service, provider)


def active() -> bool:
    """True when this process records spans (an SDK provider was installed)."""
    return _active


# ------------------------------------------------------------------------------ sampling


class SkipOrphanQueries:
    """A sampler that drops root spans of database queries (a query with no parent span: the
    scheduler's passes, claim polls, health checks) and defers everything else to ``delegate``.
    A query inside a request or job span follows its parent as usual."""

    def __init__(self, delegate: Any):
        self.delegate = delegate

    def should_sample(self, parent_context: Any, trace_id: int, name: str, kind: Any = None,
                      attributes: Any = None, links: Any = None, trace_state: Any = None) -> Any:
        from opentelemetry.sdk.trace.sampling import Decision, SamplingResult

        if (kind == SpanKind.CLIENT and attributes and "db.system" in attributes
                and not trace.get_current_span(parent_context).get_span_context().is_valid):
            return SamplingResult(Decision.DROP)
        return self.delegate.should_sample(parent_context, trace_id, name, kind, attributes, links,
                                           trace_state)

    def get_description(self) -> str:
        return f"SkipOrphanQueries{{{self.delegate.get_description()}}}"


# ------------------------------------------------------------------------------ propagation


def current_trace_context() -> dict[str, str] | None:
    """The current span's W3C context as ``{"traceparent": …, "tracestate"?: …}`` (what a job
    row stores), or None when there is no current span (or tracing is off)."""
    if not _active:
        return None
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier or None


def context_from(trace_context: Any) -> Any:
    """The OTel context a stored ``trace_context`` describes (None when there is none, when
    tracing is off, or when the value is not a ``{str: str}`` mapping the W3C propagator accepts:
    the span then starts a new trace). Never raises: a malformed row must not stop its job."""
    if not trace_context or not _active:
        return None
    if not isinstance(trace_context, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in trace_context.items()):
        log.warning("ignoring a malformed trace_context %.200r", trace_context)
        return None
    try:
        return propagate.extract(dict(trace_context))
    except Exception as exc:  # a propagator's parse error: start a new trace instead
        log.warning("ignoring trace_context %.200r: %s", trace_context, exc)
        return None


# ------------------------------------------------------------------------------ spans


def error_class(exc: BaseException) -> str:
    """The z9 error class of ``exc``: ``temporary``, ``permanent``, ``snooze`` (its
    ``error_class``), ``cancelled`` for task cancellation, else ``internal``."""
    cls = getattr(exc, "error_class", None)
    if cls:
        return str(cls)
    return "cancelled" if isinstance(exc, asyncio.CancelledError) else "internal"


def record_error(exc: BaseException, span: Any = None) -> None:
    """Mark ``span`` (default: the current span) failed by ``exc``: status ERROR with the
    message, an ``exception`` event, ``error.type`` (the exception class) and ``z9.error_class``
    (:func:`error_class`)."""
    if span is None:
        jt = _job_trace.get()
        span = None if jt is not None and jt.deferred else trace.get_current_span()
        if jt is not None and (span is None or not span.is_recording()):
            # deferred, or materialized in another task: the innermost record of the attempt
            span = _DeferredSpan(_current_rec.get() or jt.job_rec)
    if not span.is_recording():
        return
    span.set_status(Status(StatusCode.ERROR, f"{exc.__class__.__name__}: {exc}"))
    span.record_exception(exc)
    span.set_attribute("error.type", exc.__class__.__qualname__)
    span.set_attribute("z9.error_class", error_class(exc))


class _Off:
    """The span context manager while tracing is off: yields the invalid (no-op) span and
    attaches nothing, at the cost of a ``with`` statement."""

    __slots__ = ()

    def __enter__(self) -> Any:
        return trace.INVALID_SPAN

    def __exit__(self, *exc: Any) -> None:
        return None


_OFF = _Off()


def span(name: str, attributes: Mapping[str, Any] | None = None, *, kind: SpanKind = SpanKind.INTERNAL,
         parent: Any = None) -> ContextManager[Any]:
    """A span named ``name``, current for the ``with`` body (and for threads run in a copy of
    the context). ``parent`` is an OTel context (:func:`context_from`); None means the current
    span. An exception leaving the body is recorded (:func:`record_error`) and re-raised.
    When tracing is off this is a shared no-op context manager yielding the invalid span
    (``bench/tracing_overhead.py`` measures both)."""
    if not _active:
        return _OFF
    jt = _job_trace.get()
    if jt is not None and parent is None:
        if jt.deferred:
            return _deferred_span(jt, name, attributes, kind)
        if not trace.get_current_span().is_recording():
            # materialized in another task (a gather's child): this task still has the deferred
            # context; the span goes under the innermost open record of the attempt
            rec = _current_rec.get() or jt.job_rec
            if rec.real is not None:
                parent = otel_context.set_value(_SUPPRESS_INSTRUMENTATION_KEY, False,
                                                trace.set_span_in_context(rec.real))
    return _recording_span(name, attributes, kind, parent)


@contextmanager
def _recording_span(name: str, attributes: Mapping[str, Any] | None, kind: SpanKind, parent: Any) -> Iterator[Any]:
    with _tracer.start_as_current_span(name, context=parent, kind=kind, attributes=attributes,
                                       record_exception=False, set_status_on_exception=False) as s:
        try:
            yield s
        except BaseException as exc:
            record_error(exc, s)
            raise


def job_attributes(job: Any) -> dict[str, Any]:
    """Span attributes of a job row (``z9.common.models.Job``)."""
    attrs = {"job.id": job.id, "job.kind": job.kind, "job.region": job.region, "job.attempt": job.attempt}
    if job.resource_id:
        attrs["z9.resource.id"] = job.resource_id
        attrs["z9.resource.type"] = job.resource_type or ""
    return attrs


def job_span(job: Any, uneventful_ratio: float = 1.0) -> ContextManager[Any]:
    """The span of one attempt of ``job`` (``job <Kind>``), a child of the context stored in
    its row when there is one; set ``job.outcome`` on it when the attempt ends. Deferred (see the
    module docstring): exported only once the attempt has something to do (:func:`materialize`),
    fails, or does not end ``succeeded`` — else with probability ``uneventful_ratio``."""
    if not _active:
        return _OFF
    return _deferred_job(job, uneventful_ratio)


# ------------------------------------------------------------------------------ deferred job spans


class _Rec:
    """A span of a deferred job attempt, kept as data until the attempt proves eventful."""

    __slots__ = ("name", "attributes", "kind", "start", "end", "parent", "status", "events", "real", "owner", "token")

    def __init__(self, name: str, attributes: Mapping[str, Any] | None, kind: SpanKind, parent: "_Rec | None"):
        self.name, self.kind, self.parent = name, kind, parent
        self.attributes: dict[str, Any] = dict(attributes) if attributes else {}
        self.start = time.time_ns()
        self.end: int | None = None
        self.status: Status | None = None
        self.events: list[tuple[str, Any, int]] = []  # (name or "exception", attributes or exc, time)
        self.real: Any = None  # the SDK span, once materialized
        self.owner: Any = None  # the task (or thread) whose ``with`` block it is (_owner())
        self.token: Any = None  # the context attached in that block once materialized (_attach_for)


def _owner() -> Any:
    """The task running this code, or the thread when no task is: a context token can be detached
    only where it was attached, and a ``with`` block starts and ends in one task."""
    try:
        task = asyncio.current_task()
    except RuntimeError:  # no running loop: a thread (the Proxmox client's pool)
        task = None
    return task if task is not None else threading.get_ident()


def _attach_for(rec: _Rec) -> None:
    """Make ``rec``'s real span current, instrumentation on, for the rest of ``rec``'s ``with``
    block when this is that block's task (the token is detached when the block ends); in another
    task or thread (a gather's child, the Proxmox thread) the context is attached for that task's
    own context only, which ends with it — its token is never detached elsewhere."""
    token = otel_context.attach(otel_context.set_value(
        _SUPPRESS_INSTRUMENTATION_KEY, False, trace.set_span_in_context(rec.real)))
    if rec.owner == _owner():
        if rec.token is not None:  # already attached in this block: keep the latest on top
            otel_context.detach(token)
            return
        rec.token = token


class _DeferredSpan:
    """What a ``with`` of :func:`span` yields while the job attempt is deferred: it keeps what is
    set on it in its record (and passes it on to the real span once there is one)."""

    __slots__ = ("rec",)

    def __init__(self, rec: _Rec):
        self.rec = rec

    def is_recording(self) -> bool:
        return True

    def get_span_context(self) -> Any:
        return self.rec.real.get_span_context() if self.rec.real is not None else trace.INVALID_SPAN_CONTEXT

    def set_attribute(self, key: str, value: Any) -> None:
        self.rec.attributes[key] = value
        if self.rec.real is not None:
            self.rec.real.set_attribute(key, value)

    def set_attributes(self, attributes: Mapping[str, Any]) -> None:
        for k, v in attributes.items():
            self.set_attribute(k, v)

    def set_status(self, status: Any, description: str | None = None) -> None:
        self.rec.status = status if isinstance(status, Status) else Status(status, description)
        if self.rec.real is not None:
            self.rec.real.set_status(self.rec.status)

    def record_exception(self, exception: BaseException, attributes: Any = None, timestamp: int | None = None,
                         escaped: bool = False) -> None:
        self.rec.events.append(("exception", exception, timestamp or time.time_ns()))
        if self.rec.real is not None:
            self.rec.real.record_exception(exception, attributes, timestamp, escaped)

    def add_event(self, name: str, attributes: Any = None, timestamp: int | None = None) -> None:
        self.rec.events.append((name, attributes, timestamp or time.time_ns()))
        if self.rec.real is not None:
            self.rec.real.add_event(name, attributes, timestamp)


class _JobTrace:
    """One job attempt's trace while deferred: its records in start order (parents first)."""

    __slots__ = ("job_rec", "parent_ctx", "records", "deferred")

    def __init__(self, name: str, attributes: dict[str, Any], parent_ctx: Any):
        self.job_rec = _Rec(name, attributes, SpanKind.CONSUMER, None)
        self.parent_ctx = parent_ctx
        self.records: list[_Rec] = []
        self.deferred = True  # False once materialized, or once the attempt ended

    def eventful(self) -> bool:
        """Something to keep: an error anywhere, or an outcome other than ``succeeded``."""
        if self.job_rec.attributes.get("job.outcome", "succeeded") != "succeeded":
            return True
        return any(r.status is not None and r.status.status_code == StatusCode.ERROR
                   for r in (self.job_rec, *self.records))


_job_trace: contextvars.ContextVar[_JobTrace | None] = contextvars.ContextVar("z9_job_trace", default=None)
_current_rec: contextvars.ContextVar[_Rec | None] = contextvars.ContextVar("z9_job_trace_rec", default=None)


class _deferred_span:
    """A span of a deferred attempt: a record (a class, not a generator: this is the hot path of
    every job while tracing is on)."""

    __slots__ = ("jt", "rec", "token", "stand_in")

    def __init__(self, jt: _JobTrace, name: str, attributes: Mapping[str, Any] | None, kind: SpanKind):
        self.jt = jt
        self.rec = _Rec(name, attributes, kind, _current_rec.get())

    def __enter__(self) -> Any:
        self.rec.owner = _owner()
        self.jt.records.append(self.rec)
        self.token = _current_rec.set(self.rec)
        self.stand_in = _DeferredSpan(self.rec)
        return self.stand_in

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        rec = self.rec
        if exc is not None:
            record_error(exc, self.stand_in)
        rec.end = time.time_ns()
        _current_rec.reset(self.token)
        if rec.real is not None:  # materialized while it was open
            rec.real.end(end_time=rec.end)
            if rec.token is not None:  # materialize() ran in this block: its parent is current again
                otel_context.detach(rec.token)
                rec.token = None
                parent = rec.parent if rec.parent is not None else self.jt.job_rec
                if parent.real is not None and parent.end is None:
                    _attach_for(parent)


class _deferred_job:
    """The span of one job attempt, deferred (:func:`job_span`)."""

    __slots__ = ("job", "ratio", "jt", "ctx_token", "jt_token", "rec_token", "stand_in")

    def __init__(self, job: Any, ratio: float):
        self.job, self.ratio = job, ratio

    def __enter__(self) -> Any:
        parent = context_from(self.job.trace_context)
        self.jt = jt = _JobTrace(f"job {self.job.kind}", job_attributes(self.job), parent)
        jt.job_rec.owner = _owner()
        # the request's trace stays current (log lines carry its id); instrumented queries are not
        # traced. An executor's job task already runs with them suppressed (quiet_context): then a
        # job without a stored context has nothing to attach.
        if parent is None and otel_context.get_value(_SUPPRESS_INSTRUMENTATION_KEY):
            self.ctx_token = None
        else:
            self.ctx_token = otel_context.attach(otel_context.set_value(_SUPPRESS_INSTRUMENTATION_KEY, True, parent))
        self.jt_token, self.rec_token = _job_trace.set(jt), _current_rec.set(None)
        self.stand_in = _DeferredSpan(jt.job_rec)
        return self.stand_in

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        jt = self.jt
        if exc is not None:
            record_error(exc, self.stand_in)
        jt.job_rec.end = time.time_ns()
        try:
            if jt.deferred and (jt.eventful() or (self.ratio > 0 and random.random() < self.ratio)):
                _materialize(jt)
            if jt.job_rec.real is not None:
                jt.job_rec.real.end(end_time=jt.job_rec.end)
        except Exception:  # tracing is best effort: never fail a job over it
            log.warning("recording the trace of job %s failed", self.job.id, exc_info=True)
        finally:
            jt.deferred = False
            if jt.job_rec.token is not None:
                otel_context.detach(jt.job_rec.token)
                jt.job_rec.token = None
            _current_rec.reset(self.rec_token)
            _job_trace.reset(self.jt_token)
            if self.ctx_token is not None:
                otel_context.detach(self.ctx_token)


def _replay(rec: _Rec, parent_span: Any) -> Any:
    s = _tracer.start_span(rec.name, context=trace.set_span_in_context(parent_span), kind=rec.kind,
                           attributes=rec.attributes, start_time=rec.start, record_exception=False,
                           set_status_on_exception=False)
    for name, what, at in rec.events:
        if name == "exception":
            s.record_exception(what, timestamp=at)
        else:
            s.add_event(name, what, at)
    if rec.status is not None:
        s.set_status(rec.status)
    rec.real = s
    return s


def _materialize(jt: _JobTrace) -> None:
    """Turn the attempt's records into SDK spans (recorded times, same parents); records still
    open get their real span ended when they end."""
    jt.deferred = False
    root = _replay(jt.job_rec, trace.get_current_span(jt.parent_ctx or otel_context.Context()))
    for rec in jt.records:
        s = _replay(rec, rec.parent.real if rec.parent is not None else root)
        if rec.end is not None:
            s.end(end_time=rec.end)


def quiet_context() -> contextvars.Context:
    """A fresh context for the executor's own background work (the finish batcher's task, the
    claim loop): no job trace, no job's log fields, and instrumented queries not traced — they
    belong to no request (the sampler would drop them as orphans, after paying for a span each),
    and a batch task started from one sampled job's context used to put every later batch's
    queries into that job's trace."""
    ctx = contextvars.Context()
    if _active:
        ctx.run(otel_context.attach, otel_context.set_value(_SUPPRESS_INSTRUMENTATION_KEY, True,
                                                            otel_context.Context()))
    return ctx


def materialize() -> None:
    """The current job attempt has something to do: export it (its spans so far, with their
    times) and trace the rest of it as usual — spans and instrumented queries. No-op when tracing
    is off, outside a job, or when already done."""
    jt = _job_trace.get()
    if jt is None or not jt.deferred:
        return
    _materialize(jt)
    _attach_for(_current_rec.get() or jt.job_rec)
