"""Every Prometheus metric z9 exports (prometheus-client), and the small helpers services call.

The catalog — names, types, labels, meanings — is ``docs/metrics.md``; this module is its code.
Metric objects live in prometheus-client's default registry (which also carries the standard
``process_*`` and ``python_*`` collectors), so one ``/metrics`` per process shows everything the
process does. Label values come from bounded sets only (kind, region, status, outcome, error
class, route or endpoint template, phase, task type) — never an id, a vmid or a tenant.

Each service pre-initialises the label sets it knows at start (``init_api``,
``init_scheduler``, ``init_executor``, ``init_proxmox``, ``init_reaper``): every series a
dashboard or an alert asks for exists at 0 before anything happens, so their expressions return
data on a quiet stack.

Serving: the API's ``GET /metrics`` route answers from :func:`exposition`; ``z9 scheduler``,
``z9 executor`` and ``z9 reaper`` (``z9/cli.py``) call :func:`serve` with
``Z9_METRICS_HOST``/``Z9_METRICS_PORT``.
"""
from __future__ import annotations

import asyncio
import time
from contextlib import contextmanager
from datetime import datetime
from typing import Any, Iterable, Iterator, Mapping

from prometheus_client import REGISTRY, Counter, Gauge, Histogram, disable_created_metrics, start_http_server
from prometheus_client.exposition import choose_encoder

from .errors import GuardRefusal, InternalError, PermanentError, Snooze, TemporaryError

# No ``*_created`` series next to every counter and histogram: they double the series count and
# no z9 dashboard or alert uses them (prometheus-client's switch; process-wide).
disable_created_metrics()

# ---------------------------------------------------------------------------------- label sets

JOB_STATUSES = ("pending", "running", "retry", "succeeded", "failed")
LIVE_JOB_STATUSES = ("pending", "running", "retry")
PHASES = ("observe", "plan", "apply", "verify")
#: (outcome, error_class) pairs one attempt can end with (see ``docs/metrics.md``).
ATTEMPT_ENDINGS = (
    ("succeeded", "none"),
    ("snoozed", "none"),
    ("retry", "temporary"),
    ("retry", "internal"),
    ("failed", "permanent"),
    ("failed", "guard"),
    ("failed", "attempts_exhausted"),
    ("lease_lost", "lease_lost"),
    ("lease_lost", "temporary"),
    ("lease_lost", "internal"),
    ("handed_over", "none"),
)
OUTCOMES = tuple(dict.fromkeys(o for o, _ in ATTEMPT_ENDINGS))
#: Proxmox task types (UPID ``type`` field) z9's jobs start.
TASK_TYPES = ("qmclone", "qmconfig", "resize", "qmstart", "qmshutdown", "qmstop", "qmdestroy")
TASK_OUTCOMES = ("ok", "warnings", "failed", "deadline")

# Buckets (seconds). Attempts and phases run from milliseconds (an empty plan) to the task
# deadline (600 s); queue waits from an instant claim to a backlog of an hour.
_JOB_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)
_WAIT_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)
_REQUEST_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
_TASK_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)

# ---------------------------------------------------------------------------------- scheduler

JOBS = Gauge(
    "z9_jobs",
    "Jobs in the table by status (index-only counts, refreshed by the scheduler every "
    "Z9_JOB_METRICS_INTERVAL_S; replicas report the same figure, so aggregate with max).",
    ["kind", "region", "status"])
JOB_OLDEST_PENDING_AGE = Gauge(
    "z9_job_oldest_pending_age_seconds",
    "Age of the oldest runnable pending job (now - max(created_at, run_after)); 0 when none.",
    ["region"])
TENANT_JOBS_PENDING = Gauge(
    "z9_tenant_jobs_pending",
    "Pending jobs by tenant, refreshed by the scheduler: in each region the Z9_TENANT_METRICS_TOP_N "
    "tenants with the most pending jobs by id, every other tenant summed as tenant=\"_other\" (z9's own "
    "jobs: tenant=\"_none\"); a tenant leaving the top is removed, so a region has at most N + 1 series.",
    ["region", "tenant"])
TENANT_OLDEST_PENDING_AGE = Gauge(
    "z9_tenant_oldest_pending_age_seconds",
    "How long each tenant's oldest pending job has waited (now - max(created_at, run_after)), for the "
    "tenants of z9_tenant_jobs_pending (tenant=\"_other\": the longest wait among the rest).",
    ["region", "tenant"])
TENANT_OTHER = "_other"
TENANT_NONE = "_none"
LEASE_RECLAIMS = Counter(
    "z9_lease_reclaims_total",
    "Running jobs whose lease expired and were taken back (attempt spent).",
    ["kind", "region"])
JOB_PROMOTIONS = Counter(
    "z9_job_promotions_total",
    "retry jobs moved back to pending once run_after passed.",
    ["region"])
JOBS_PRUNED = Counter(
    "z9_jobs_pruned_total",
    "Finished jobs deleted after the retention period.",
    registry=None)  # registered by init_scheduler: only schedulers export it

# ---------------------------------------------------------------------------------- executor

JOB_ATTEMPTS = Counter(
    "z9_job_attempts_total",
    "Attempts that ended, by outcome (succeeded, retry, snoozed, failed, lease_lost, "
    "handed_over) and error class.",
    ["kind", "region", "outcome", "error_class"])
JOB_DURATION = Histogram(
    "z9_job_duration_seconds",
    "One attempt, from claim to its recorded end.",
    ["kind", "region", "outcome"], buckets=_JOB_BUCKETS)
JOB_PHASE_DURATION = Histogram(
    "z9_job_phase_duration_seconds",
    "One phase (observe, plan, apply, verify) of one attempt.",
    ["kind", "region", "phase"], buckets=_JOB_BUCKETS)
JOB_QUEUE_WAIT = Histogram(
    "z9_job_queue_wait_seconds",
    "From the moment a job became runnable (max(created_at, run_after)) to its claim.",
    ["kind", "region"], buckets=_WAIT_BUCKETS)
DELETION_GUARD_REFUSALS = Counter(
    "z9_deletion_guard_refusals_total",
    "Jobs refused by the deletion guard (a platform-role VM, or a row pointing at one). Any is a page.",
    ["kind", "region"])
PROXMOX_REQUESTS = Counter(
    "z9_proxmox_requests_total",
    "Proxmox API calls by path template; status is the HTTP status or 'error' (no answer).",
    ["region", "method", "endpoint", "status"])
PROXMOX_REQUEST_DURATION = Histogram(
    "z9_proxmox_request_duration_seconds",
    "Proxmox API call duration.",
    ["region", "method", "endpoint"], buckets=_REQUEST_BUCKETS)
PROXMOX_SNAPSHOT_LOOKUPS = Counter(
    "z9_proxmox_snapshot_lookups_total",
    "Lookups of the executor process's shared /cluster/resources snapshot: 'listed' sent a new listing, "
    "'shared' was answered by a young snapshot or a listing already in flight.",
    ["region", "outcome"])
PROXMOX_TASK_WAIT = Histogram(
    "z9_proxmox_task_wait_seconds",
    "Waiting for a Proxmox task (UPID) to end, by task type and outcome (ok, warnings, failed, deadline).",
    ["region", "task_type", "outcome"], buckets=_TASK_BUCKETS)
EXECUTOR_IN_FLIGHT = Gauge(
    "z9_executor_jobs_in_flight",
    "Jobs this executor runs now.",
    ["region"])
EXECUTOR_LISTEN_HEALTHY = Gauge(
    "z9_executor_listen_healthy",
    "1 while the executor's LISTEN connection is up, 0 while it is being re-established.",
    registry=None)  # registered by init_executor: only executors export it
EXECUTOR_LISTEN_RECONNECTS = Counter(
    "z9_executor_listen_reconnects_total",
    "LISTEN connections re-established (each followed by a catch-up claim).",
    registry=None)  # registered by init_executor

SDN_APPLY_BLOCKED = Gauge(
    "z9_sdn_apply_blocked",
    "1 while the region's SDN apply is blocked, by why (code: foreign_sdn_edits — pending SDN edits "
    "z9 did not make; sdn_locked — a lock z9 did not take; node_reload_failed — a node did not reload): "
    "set by the executor running the region's SdnApply job, 0 once an apply goes through.",
    ["region", "code"])
SDN_BLOCK_CODES = ("foreign_sdn_edits", "sdn_locked", "node_reload_failed")
REGION_CAP = Gauge(
    "z9_region_cap_jobs",
    "The region's cap on running jobs across all executors (RegionSettings.max_concurrent_jobs) "
    "as this executor enforces it; no series for a region without a cap.",
    ["region"])
REGION_CAP_WAITS = Counter(
    "z9_region_cap_waits_total",
    "Claims of this executor that took fewer jobs than it had room for because the region was at "
    "its cap while claimable jobs of the region waited.",
    ["region"])

# ---------------------------------------------------------------------------------- database

DATABASE_SERVER = Gauge(
    "z9_database_server_info",
    "1 for the PostgreSQL server (host:port as configured) this process's connections of that kind "
    "(pool, listen) last reached and checked as the primary; after a failover it names the new one.",
    ["connection", "server"])

DATABASE_REFUSALS = Counter(
    "z9_database_refusals_total",
    "Writable PostgreSQL hosts this process refused (z9.common.dbfence): on an older timeline than one it "
    "used (an old primary back after a failover: split brain), or of another database system.",
    ["reason"])
for _reason in ("older_timeline", "other_system"):  # every series from the start: increase() sees the first
    DATABASE_REFUSALS.labels(_reason)

DATABASE_TIMELINE = Gauge(
    "z9_database_timeline",
    "The newest PostgreSQL timeline this process has used (it grows by one at each failover).")

DATABASE_ABANDONED = Counter(
    "z9_database_abandoned_statements_total",
    "Statements (commits waiting on synchronous replication, most often) abandoned after "
    "statement_timeout + Z9_DATABASE_SYNC_COMMIT_TIMEOUT_S without an answer: the connection was closed "
    "and the next one chosen again.")

# ---------------------------------------------------------------------------------- reaper

DELETION_BUFFER_EXPIRIES = Counter(
    "z9_deletion_buffer_expiries_total",
    "Deletion buffers that expired and became a final ServerDelete.",
    ["region"])

# ---------------------------------------------------------------------------------- api

HTTP_REQUESTS = Counter(
    "z9_http_requests_total",
    "API requests by route template ('unmatched' for no route) and status.",
    ["method", "route", "status"])
HTTP_REQUEST_DURATION = Histogram(
    "z9_http_request_duration_seconds",
    "API request duration.",
    ["method", "route"], buckets=_REQUEST_BUCKETS)
API_JOB_WAITERS = Gauge(
    "z9_api_job_waiters",
    "Requests waiting now on a job's change (GET /v1/jobs/{id}?wait_s=).",
    registry=None)  # registered by init_api: only API processes export it
API_LISTEN_HEALTHY = Gauge(
    "z9_api_listen_healthy",
    "1 while the API's LISTEN connection for job changes is up; 0 while waiters poll every second instead.",
    registry=None)  # registered by init_api
API_RATE_LIMITED = Counter(
    "z9_api_rate_limited_total",
    "Requests answered 429 because their token's rate limit was exceeded.",
    registry=None)  # registered by init_api

API_CONNECTIONS_REFUSED = Counter(
    "z9_api_connections_refused_total",
    "API connections refused or cut: over the cap per client address (per_address) or in all (total), "
    "headers or body not complete in time (header_timeout, body_timeout).",
    ["reason"], registry=None)  # registered by init_api
API_CLIENT_DISCONNECTS = Counter(
    "z9_api_client_disconnects_total",
    "Requests whose client went away before the answer (counted as status 499, never as a 5xx).",
    registry=None)  # registered by init_api


# ---------------------------------------------------------------------------------- pre-initialisation

def init_scheduler(kinds: Iterable[str], regions: Iterable[str]) -> None:
    """Create the scheduler's series at 0 for every ``kind`` × ``region`` (× job status)."""
    kinds, regions = list(kinds), list(regions)
    _register_once(JOBS_PRUNED)
    for region in regions:
        JOB_OLDEST_PENDING_AGE.labels(region).set(0)
        JOB_PROMOTIONS.labels(region)
        for kind in kinds:
            LEASE_RECLAIMS.labels(kind, region)
            JOB_ATTEMPTS.labels(kind, region, "failed", "attempts_exhausted")  # see reclaim_failed
            for status in JOB_STATUSES:
                JOBS.labels(kind, region, status)


def reclaim_failed(kind: str, region: str) -> None:
    """Count a job the scheduler failed at lease reclaim (its attempts ran out while no executor
    held it) as ``z9_job_attempts_total{outcome="failed", error_class="attempts_exhausted"}``: no
    executor can count that ending, and the failure alerts must see it."""
    JOB_ATTEMPTS.labels(kind, region, "failed", "attempts_exhausted").inc()


_registered: set[Any] = set()


def _register_once(metric: Any) -> None:
    """Add an unlabelled metric (made with ``registry=None``, since it would otherwise be exported
    at 0 by every process) to the default registry, once per process however many services of
    its kind the process runs."""
    if metric not in _registered:
        REGISTRY.register(metric)
        _registered.add(metric)


def init_executor(kinds: Iterable[str], regions: Iterable[str]) -> None:
    """Create the executor's per-job series at 0 for every ``kind`` × ``region`` × the outcome /
    error-class pairs of :data:`ATTEMPT_ENDINGS`, phases and outcomes."""
    kinds, regions = list(kinds), list(regions)
    for metric in (EXECUTOR_LISTEN_HEALTHY, EXECUTOR_LISTEN_RECONNECTS):
        _register_once(metric)
    EXECUTOR_LISTEN_HEALTHY.set(0)
    for region in regions:
        EXECUTOR_IN_FLIGHT.labels(region)
        for code in SDN_BLOCK_CODES:
            SDN_APPLY_BLOCKED.labels(region, code)
        for kind in kinds:
            JOB_QUEUE_WAIT.labels(kind, region)
            DELETION_GUARD_REFUSALS.labels(kind, region)
            for outcome, error_class in ATTEMPT_ENDINGS:
                JOB_ATTEMPTS.labels(kind, region, outcome, error_class)
            for outcome in OUTCOMES:
                JOB_DURATION.labels(kind, region, outcome)
            for phase in PHASES:
                JOB_PHASE_DURATION.labels(kind, region, phase)


def init_region_caps(caps: dict[str, int]) -> None:
    """An executor's capped regions: the cap's gauge, and its waits at 0."""
    for region, cap in caps.items():
        REGION_CAP.labels(region).set(cap)
        REGION_CAP_WAITS.labels(region)


def region_cap_held(region: str) -> None:
    """A claim held back by the region's cap."""
    _child(REGION_CAP_WAITS, region).inc()


def init_proxmox(region: str, endpoints: Iterable[str]) -> None:
    """Create one region's Proxmox series at 0: each endpoint (``"METHOD /path/template"``) with
    status ``200`` and ``error``, and each task type × task outcome."""
    for endpoint in endpoints:
        method, _, path = endpoint.partition(" ")
        PROXMOX_REQUEST_DURATION.labels(region, method, path)
        for status in ("200", "error"):
            PROXMOX_REQUESTS.labels(region, method, path, status)
    for task_type in TASK_TYPES:
        for outcome in TASK_OUTCOMES:
            PROXMOX_TASK_WAIT.labels(region, task_type, outcome)
    for outcome in ("listed", "shared"):
        PROXMOX_SNAPSHOT_LOOKUPS.labels(region, outcome)


def proxmox_snapshot_lookup(region: str, outcome: str) -> None:
    """One lookup of the shared ``/cluster/resources`` snapshot: ``listed`` or ``shared``."""
    PROXMOX_SNAPSHOT_LOOKUPS.labels(region, outcome).inc()


RESOURCES_DRIFTED = Gauge(
    "z9_resources_drifted",
    "Live resources whose last periodic plan found drift (their job would change something), by kind.",
    ["kind"])
RESOURCES_DRIFTED_OLDEST = Gauge(
    "z9_resources_drifted_oldest_seconds",
    "How long the resource of this kind drifted longest has stayed drifted (0: none is).",
    ["kind"])


def init_reaper(regions: Iterable[str], planned_kinds: Iterable[str] = ()) -> None:
    """Create the reaper's series at 0 for every region, and the drift gauges for every kind it plans."""
    for region in regions:
        DELETION_BUFFER_EXPIRIES.labels(region)
    for kind in planned_kinds:
        RESOURCES_DRIFTED.labels(kind)
        RESOURCES_DRIFTED_OLDEST.labels(kind)


#: HTTP methods kept as ``method`` label values; any other (``PROPFIND``, an invented token the
#: pure-Python parser lets through) is ``other``, so clients cannot grow the label set.
HTTP_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def http_method_label(method: str) -> str:
    """``method`` when it is one of :data:`HTTP_METHODS`, else ``other``."""
    return method if method in HTTP_METHODS else "other"


def init_api(routes: Iterable[tuple[str, str]]) -> None:
    """Create the API's series at 0 for every ``(method, route template)``: its duration and a
    ``500`` count, so error-rate expressions return 0 rather than nothing."""
    for method, route in routes:
        HTTP_REQUEST_DURATION.labels(method, route)
        HTTP_REQUESTS.labels(method, route, "500")
    for metric in (API_JOB_WAITERS, API_LISTEN_HEALTHY, API_RATE_LIMITED, API_CONNECTIONS_REFUSED,
                   API_CLIENT_DISCONNECTS):
        _register_once(metric)
    for reason in ("per_address", "total", "header_timeout", "body_timeout"):
        API_CONNECTIONS_REFUSED.labels(reason)


# ---------------------------------------------------------------------------------- executor helpers

def error_class(exc: BaseException) -> str:
    """The ``error_class`` label of the exception that ended an attempt: ``guard``,
    ``permanent``, ``internal`` (an unexpected exception, retried), ``temporary``, ``none``
    (a snooze: waiting on the world is no error)."""
    if isinstance(exc, GuardRefusal):
        return "guard"
    if isinstance(exc, PermanentError):
        return "permanent"
    if isinstance(exc, InternalError):
        return "internal"
    if isinstance(exc, Snooze):
        return "none"
    if isinstance(exc, TemporaryError):
        return "temporary"
    return "internal"


_children: dict[tuple[Any, ...], Any] = {}


def _child(metric: Any, *labels: str) -> Any:
    """``metric.labels(*labels)``, remembered: prometheus-client returns the same child for the
    same labels, but finding it takes a lock and a few microseconds, and the executor asks for
    several per job (label sets are bounded, so is this cache)."""
    key = (metric, *labels)
    child = _children.get(key)
    if child is None:
        child = _children[key] = metric.labels(*labels)
    return child


def job_claimed(job: Any) -> None:
    """A claim: observe the queue wait (claim time − max(created_at, run_after), all from the
    database clock: the claim sets ``updated_at``) and count the job in flight. ``job`` is a
    :class:`~z9.common.models.Job` fresh from ``job_claim``."""
    runnable: datetime = max(job.created_at, job.run_after)
    _child(JOB_QUEUE_WAIT, job.kind, job.region).observe(max(0.0, (job.updated_at - runnable).total_seconds()))
    _child(EXECUTOR_IN_FLIGHT, job.region).inc()


def job_released(job: Any) -> None:
    """The executor no longer runs ``job`` (its task ended)."""
    _child(EXECUTOR_IN_FLIGHT, job.region).dec()


def attempt_ended(job: Any, outcome: str, error_class: str, started: float) -> None:
    """Count one attempt of ``job`` that ended with ``outcome`` / ``error_class`` (see
    :data:`ATTEMPT_ENDINGS`); ``started`` is the ``time.monotonic()`` of its claim."""
    _child(JOB_ATTEMPTS, job.kind, job.region, outcome, error_class).inc()
    _child(JOB_DURATION, job.kind, job.region, outcome).observe(time.monotonic() - started)


def guard_refused(job: Any) -> None:
    """The deletion guard refused ``job`` (a page: a platform VM was nearly touched)."""
    DELETION_GUARD_REFUSALS.labels(job.kind, job.region).inc()


class phase:
    """``with phase(job, "observe"): …`` times one phase (``observe``, ``plan``, ``apply``,
    ``verify``) of ``job``'s attempt into ``z9_job_phase_duration_seconds``, whether it ends
    normally or raises (seconds, monotonic clock). A plain class, not a generator context
    manager: it runs four times per job on the executor's hot path."""

    __slots__ = ("_hist", "_start")

    def __init__(self, job: Any, name: str) -> None:
        self._hist = _child(JOB_PHASE_DURATION, job.kind, job.region, name)
        self._start = 0.0

    def __enter__(self) -> None:
        self._start = time.perf_counter()

    def __exit__(self, *exc: Any) -> None:
        self._hist.observe(time.perf_counter() - self._start)


def listen_up(reconnected: bool) -> None:
    """The LISTEN connection is established (``reconnected``: not the first one)."""
    EXECUTOR_LISTEN_HEALTHY.set(1)
    if reconnected:
        EXECUTOR_LISTEN_RECONNECTS.inc()


def database_server(connection: str, server: str) -> None:
    """The ``connection`` kind (``pool``, ``listen``) reached ``server`` (and it is the primary):
    the one series of that kind, the previous server's removed."""
    for labels in list(DATABASE_SERVER._metrics):  # prometheus-client keeps children by label tuple
        if labels[0] == connection and labels[1] != server:
            DATABASE_SERVER.remove(*labels)
    DATABASE_SERVER.labels(connection, server).set(1)


def database_refused(reason: str) -> None:
    """A writable database host was refused (``older_timeline`` or ``other_system``)."""
    DATABASE_REFUSALS.labels(reason).inc()


def database_timeline(timeline: int) -> None:
    DATABASE_TIMELINE.set(timeline)


def database_abandoned() -> None:
    DATABASE_ABANDONED.inc()


def listen_down() -> None:
    """The LISTEN connection is down (being re-established, or the executor stopped)."""
    EXECUTOR_LISTEN_HEALTHY.set(0)


@contextmanager
def proxmox_request(region: str, endpoint: str) -> Iterator[None]:
    """Count and time one Proxmox API call. ``endpoint`` is ``"METHOD /path/template"``.
    The status is 200 when the block returns; on an exception, the ``status_code`` of the
    exception or of its cause (proxmoxer's ``ResourceException``, when the boundary translated
    it), else ``error`` (no answer: timeout, connection failure, cancelled)."""
    method, _, path = endpoint.partition(" ")
    start = time.perf_counter()
    status = "200"
    try:
        yield
    except BaseException as exc:
        code = getattr(exc, "status_code", None) or getattr(exc.__cause__, "status_code", None)
        status = str(code) if code else "error"
        raise
    finally:
        PROXMOX_REQUEST_DURATION.labels(region, method, path).observe(time.perf_counter() - start)
        PROXMOX_REQUESTS.labels(region, method, path, status).inc()


class TaskWait:
    """What :func:`proxmox_task_wait` yields: set ``outcome`` (``ok``, ``warnings``,
    ``failed``, ``deadline``) before leaving, or :meth:`exitstatus` with the task's."""

    def __init__(self) -> None:
        self.outcome: str | None = None

    def exitstatus(self, exitstatus: str) -> str:
        """Record a successful task's ``exitstatus`` (``OK`` or ``WARNINGS: n``); returns it."""
        self.outcome = "ok" if exitstatus == "OK" else "warnings"
        return exitstatus


@contextmanager
def proxmox_task_wait(region: str, task_type: str) -> Iterator[TaskWait]:
    """Time a wait for one Proxmox task. Recorded with the outcome set on the yielded
    :class:`TaskWait`; an exception without one counts as ``failed``; a cancelled wait (the
    job was given up) is not recorded."""
    wait = TaskWait()
    start = time.perf_counter()
    try:
        yield wait
    except asyncio.CancelledError:
        raise
    except BaseException:
        wait.outcome = wait.outcome or "failed"
        raise
    finally:
        if wait.outcome is not None:
            PROXMOX_TASK_WAIT.labels(region, task_type, wait.outcome).observe(time.perf_counter() - start)


# ---------------------------------------------------------------------------------- scheduler helpers

def set_job_counts(rows: Iterable[tuple[str, str, str, int]], statuses: Iterable[str],
                   kinds: Iterable[str], regions: Iterable[str]) -> None:
    """Replace the ``statuses`` series of ``z9_jobs`` with ``rows`` of ``(kind, region, status,
    count)``: every series of those statuses not in ``rows`` — pre-initialised (``kinds`` ×
    ``regions``) or seen before — reads 0."""
    statuses = set(statuses)
    counts = {(k, r, s): n for k, r, s, n in rows}
    known = {(k, r, s) for k in kinds for r in regions for s in statuses}
    known |= {labels for labels in _seen_job_series if labels[2] in statuses}
    for labels in known | counts.keys():
        JOBS.labels(*labels).set(counts.get(labels, 0))
    _seen_job_series.update(counts)


_seen_job_series: set[tuple[str, str, str]] = set()


def set_tenant_waits(rows: Iterable[Mapping[str, Any]], top_n: int) -> None:
    """Replace ``z9_tenant_jobs_pending`` and ``z9_tenant_oldest_pending_age_seconds`` with
    ``rows`` (``store.job_live_by_tenant``: region, tenant_id, pending, wait_s): per region
    the ``top_n`` tenants with the most pending jobs by name, the rest as ``_other`` (present only
    when some are left out); the series of a tenant no longer among them are removed (bounded
    cardinality: at most ``top_n + 1`` per region)."""
    by_region: dict[str, list[Mapping[str, Any]]] = {}
    for r in rows:
        if r["pending"]:
            by_region.setdefault(r["region"], []).append(r)
    fresh: dict[tuple[str, str], tuple[int, float]] = {}
    for region, rs in by_region.items():
        rs.sort(key=lambda r: (-r["pending"], -r["wait_s"], r["tenant_id"] or ""))
        for r in rs[:top_n]:
            fresh[(region, r["tenant_id"] or TENANT_NONE)] = (r["pending"], r["wait_s"])
        rest = rs[top_n:]
        if rest:
            fresh[(region, TENANT_OTHER)] = (sum(r["pending"] for r in rest), max(r["wait_s"] for r in rest))
    for labels in _seen_tenant_series - fresh.keys():
        TENANT_JOBS_PENDING.remove(*labels)
        TENANT_OLDEST_PENDING_AGE.remove(*labels)
    for labels, (n, a) in fresh.items():
        TENANT_JOBS_PENDING.labels(*labels).set(n)
        TENANT_OLDEST_PENDING_AGE.labels(*labels).set(a)
    _seen_tenant_series.clear()
    _seen_tenant_series.update(fresh)


_seen_tenant_series: set[tuple[str, str]] = set()


# ---------------------------------------------------------------------------------- serving

def exposition(accept: str | None = None) -> tuple[bytes, str]:
    """The default registry as ``(body, content type)``, in the format the ``Accept`` header
    asks for (OpenMetrics, or the Prometheus text format; 0.0.4 by default) — as
    prometheus-client's own server answers."""
    encoder, content_type = choose_encoder(accept or "")
    return encoder(REGISTRY), content_type


def serve(host: str, port: int) -> Any:
    """Serve ``/metrics`` on ``host:port`` from a daemon thread (prometheus-client's own server);
    nothing when ``port`` is 0. Returns the HTTP server (its ``shutdown()`` stops it) or None.
    Raises OSError when the port is taken."""
    if not port:
        return None
    server, _thread = start_http_server(port, addr=host)
    return server
