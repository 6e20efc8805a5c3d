"""PostgreSQL connections: asyncpg pools with JSON codecs, the LISTEN channel names, and the
checks every z9 connection passes (on the primary; ``plan_cache_mode`` as z9 needs it).

Two connection strings (``libs/common/z9/common/settings.py``):

- ``Z9_DATABASE_URL`` — the pooled queries of every service. May go through PgBouncer
  (``Z9_DATABASE_POOLER=transaction`` or ``session``).
- ``Z9_DATABASE_DIRECT_URL`` (default: ``Z9_DATABASE_URL``) — every LISTEN connection and
  ``z9 migrate``: LISTEN needs one server session for its whole life (a transaction pooler drops
  notifications without an error) and the migrations hold a session advisory lock.
  :func:`direct_url` is the one place that choice is made; :func:`connect_listener` the one
  way a service opens a LISTEN connection.

High availability: both strings may name several hosts
(``postgresql://z9@db1:5432,db2:5432/z9?target_session_attrs=read-write``); asyncpg then tries
them in order and keeps the first that accepts writes, so after a failover every reconnect
lands on the new primary. z9 asks for that itself when the string says nothing
(:func:`target_session_attrs`). Every connection z9 opens also checks ``pg_is_in_recovery()`` itself
(the string may lack ``target_session_attrs``, or a pooler may sit in front) and is refused on a
standby with :class:`NotPrimaryError` — a transient error: services back off and reconnect, and a
LISTEN is never issued on a standby ("cannot execute LISTEN during recovery"). The server a
connection landed on is logged and exported as ``z9_database_server_info``.

Fence by timeline (:mod:`z9.common.dbfence`): with several hosts, a service's pooled and LISTEN
connections go to the writable host on the newest timeline of *every* host listed (not the first
writable one), and every connection is judged against the newest (system identifier, timeline) the
process has used: an old primary back writable after a failover is refused. A statement (a commit
waiting on synchronous replication, most often) that has no answer after
``Z9_DATABASE_SYNC_COMMIT_TIMEOUT_S`` is abandoned: its
connection is closed (its outcome unknown, as any lost connection's) and the next one is chosen again.
"""
from __future__ import annotations

import contextlib
import json
import logging
import socket
from typing import TYPE_CHECKING, Any, Iterator
from urllib.parse import parse_qs, urlsplit

import asyncpg

from . import dbfence
from .dbfence import StaleServerError
from .errors import DatabaseMisconfigured, DatabaseUnavailable

if TYPE_CHECKING:  # pragma: no cover
    from .settings import Settings

log = logging.getLogger("z9.db")

JOBS_CHANNEL = "z9_jobs"  # payload: the region whose jobs became claimable
SCHEDULER_CHANNEL = "z9_scheduler"  # a job entered `retry`; the scheduler recomputes its sleep
JOB_CHANGED_CHANNEL = "z9_job_changed"
"""Payload: the id of a job whose status or steps changed. Sent by the very statements that
change them (``pg_notify`` in queries/jobs.sql: claim, progress, finish, retry, promotion, reclaim),
so it costs no extra commit; the API's long-poll (``GET /v1/jobs/{id}?wait_s=``) listens."""

PLAN_CACHE_MODE: str | None = "force_custom_plan"
"""``plan_cache_mode`` of every z9 connection (None: the server's default, ``auto``). asyncpg
prepares every statement; under ``auto`` PostgreSQL switches a statement to a generic plan after
five executions when that plan looks no dearer — and on the queue's partial indexes a generic
plan built while the table looked empty can be a sequential scan. Custom plans cost a planning
per execution (tens of µs for z9's hot queries) and keep the plan right for the parameters and
the table as it is now; bench/README.md has the measurements."""


POOLERS = ("none", "session", "transaction")
"""``Z9_DATABASE_POOLER``: what sits between z9's pooled connections and PostgreSQL. ``none``:
direct. ``session``/``transaction``: PgBouncer in that pool mode — it refuses startup
parameters it does not track (``plan_cache_mode``), so z9 does not send it and relies on
``ALTER ROLE … SET plan_cache_mode`` (checked on every connection); ``transaction`` also turns
asyncpg's named prepared-statement cache off (``statement_cache_size=0``: a named statement
prepared on one server connection is unknown to the next transaction's)."""


class NotPrimaryError(ConnectionError):
    """The connection landed on a standby (in recovery) or a read-only session: z9 writes and
    LISTENs on the primary only. Transient — reconnecting finds the primary after a failover."""


def target_session_attrs(dsn: str) -> str:
    """The ``target_session_attrs`` z9 connects with: ``primary`` when ``dsn`` asks for it, else
    ``read-write`` — whatever else the string says or leaves out. asyncpg's default (``any``) keeps
    the first host that answers: with several hosts and the standby listed first (an old primary
    that rejoined after a failover), every reconnect would land on it again, be refused by
    :func:`check_server`, and the service would back off forever instead of reaching the primary
    listed second. z9 never uses a standby, so asking for a writable host costs nothing."""
    try:
        query = parse_qs(urlsplit(dsn).query)
    except ValueError:
        return "read-write"
    return "primary" if query.get("target_session_attrs", [""])[-1] == "primary" else "read-write"


@contextlib.contextmanager
def _primary_or_not() -> Iterator[None]:
    """asyncpg found no host matching :func:`target_session_attrs` (every host a standby or
    read-only): :class:`NotPrimaryError`, like z9's own check."""
    try:
        yield
    except (asyncpg.TargetServerAttributeNotMatched, dbfence.NotWritable) as e:
        raise NotPrimaryError(f"no host is the primary: every host named is a standby (in recovery) or "
                              f"read-only ({e})") from e


def _server_settings(application_name: str, pooler: str = "none",
                     bounds: dict[str, str] | None = None) -> dict[str, str]:
    out = {"application_name": application_name}
    if PLAN_CACHE_MODE and pooler == "none":
        out["plan_cache_mode"] = PLAN_CACHE_MODE
    if bounds and pooler == "none":  # PgBouncer refuses startup parameters it does not track
        out.update(bounds)
    return out


def _ms(seconds: float) -> str:
    return str(int(round(seconds * 1000)))


def session_bounds(settings: "Settings", role: str | None) -> dict[str, str]:
    """The bounded waits of a connection, as PostgreSQL startup parameters (docs/settings.md):
    ``lock_timeout`` of the ``role`` (``api``/``executor``/``scheduler``; None: no lock or statement
    bound — LISTEN connections run nothing that waits), ``statement_timeout``,
    ``idle_in_transaction_session_timeout`` and the server side's TCP keepalives. A frozen or
    partitioned process holding a row lock then stalls others for seconds, not hours. Behind
    PgBouncer these cannot be startup parameters: set them with ``ALTER ROLE … SET``."""
    out: dict[str, str] = {}
    if role is not None:
        out["lock_timeout"] = _ms(settings.db_lock_timeout_s(role))
        out["statement_timeout"] = _ms(settings.db_statement_timeout_s)
    out["idle_in_transaction_session_timeout"] = _ms(settings.db_idle_in_transaction_timeout_s)
    if settings.db_tcp_keepalives_idle_s:
        out["tcp_keepalives_idle"] = str(settings.db_tcp_keepalives_idle_s)
    if settings.db_tcp_keepalives_interval_s:
        out["tcp_keepalives_interval"] = str(settings.db_tcp_keepalives_interval_s)
    if settings.db_tcp_keepalives_count:
        out["tcp_keepalives_count"] = str(settings.db_tcp_keepalives_count)
    return out


def set_client_keepalive(conn: asyncpg.Connection, idle_s: int, interval_s: int, count: int) -> None:
    """TCP keepalive on the client's socket (asyncpg sets none): a server that vanished behind a
    partition is noticed after ``idle + interval × count`` seconds instead of the kernel's two
    hours. Unix sockets and platforms without the options are left alone."""
    transport = getattr(conn, "_transport", None)
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for opt, value in (("TCP_KEEPIDLE", idle_s), ("TCP_KEEPINTVL", interval_s), ("TCP_KEEPCNT", count)):
            if value and hasattr(socket, opt):
                sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, opt), value)
    except OSError as e:  # pragma: no cover - platform specific
        log.debug("TCP keepalive not set: %s", e)


def server_label(conn: asyncpg.Connection) -> str:
    """``host:port`` (or the Unix socket path) the connection reached, from the address asyncpg
    connected to (the DSN's spelling, so logs and metrics name the host as configured)."""
    addr = getattr(conn, "_addr", None)
    if isinstance(addr, tuple) and len(addr) >= 2:
        return f"{addr[0]}:{addr[1]}"
    return str(addr) if addr else "unknown"


async def check_server(conn: asyncpg.Connection) -> None:
    """Refuse a connection z9 must not use: on a standby or read-only (:class:`NotPrimaryError`,
    transient), or with a ``plan_cache_mode`` other than :data:`PLAN_CACHE_MODE`
    (:class:`~z9.common.errors.DatabaseMisconfigured`: behind PgBouncer the startup parameter
    cannot pass and the role's or database's default must say it; generic plans cut the claim's
    throughput 18×). One round trip."""
    row = await conn.fetchrow(
        "SELECT pg_catalog.pg_is_in_recovery() AS recovery,"
        " current_setting('transaction_read_only') AS read_only,"
        " current_setting('plan_cache_mode') AS plan_cache_mode")
    if row["recovery"] or row["read_only"] == "on":
        raise NotPrimaryError(f"{server_label(conn)} is a standby (in recovery) or read-only; "
                              "z9 needs the primary (use target_session_attrs=read-write)")
    if PLAN_CACHE_MODE and row["plan_cache_mode"] != PLAN_CACHE_MODE:
        raise DatabaseMisconfigured(
            f"plan_cache_mode is {row['plan_cache_mode']!r} on {server_label(conn)}, z9 needs "
            f"{PLAN_CACHE_MODE!r} (a pooler drops the startup setting): run "
            f"ALTER ROLE <z9 user> SET plan_cache_mode = {PLAN_CACHE_MODE} "
            f"(or ALTER DATABASE … SET, or set it in postgresql.conf); behind PgBouncer, then RECONNECT "
            f"in its admin console (server connections opened before keep the old value)")


async def check_synchronous_replication(conn: asyncpg.Connection) -> None:
    """Raise :class:`~z9.common.errors.DatabaseMisconfigured` unless a commit on this server waits
    for a synchronous standby (``synchronous_standby_names`` set and ``synchronous_commit`` at
    least ``remote_write``): without it a failover can forget a job or an allocation the API
    already answered 202 for (``Z9_DATABASE_REQUIRE_SYNC_REPLICATION``)."""
    row = await conn.fetchrow("SELECT current_setting('synchronous_standby_names') AS names,"
                              " current_setting('synchronous_commit') AS commit")
    if not row["names"] or row["commit"] in ("off", "local"):
        raise DatabaseMisconfigured(
            f"Z9_DATABASE_REQUIRE_SYNC_REPLICATION is set but {server_label(conn)} commits without "
            f"waiting for a standby (synchronous_standby_names={row['names']!r}, "
            f"synchronous_commit={row['commit']!r})")


def _json_loads(text: str) -> Any:
    """``json.loads``, with the empty object and array (a job's ``args``, ``steps`` and ``memo``
    as most claims return them) made without the parser: a new object each time (callers mutate
    them). The executor's claim decodes three jsonb columns per job (issue 33's profile)."""
    if text == "{}":
        return {}
    if text == "[]":
        return []
    return json.loads(text)


async def init_connection(conn: asyncpg.Connection) -> None:
    """Register json/jsonb codecs so jsonb columns read and write as Python objects."""
    for typ in ("json", "jsonb"):
        await conn.set_type_codec(typ, encoder=json.dumps, decoder=_json_loads, schema="pg_catalog")


_BOUNDED_WAITS = ("lock_timeout", "statement_timeout", "idle_in_transaction_session_timeout")
_unbounded_warned = False


async def warn_unbounded_waits(conn: asyncpg.Connection, expected: dict[str, str]) -> list[str]:
    """Behind a pooler z9 cannot send its bounded waits as startup parameters: say so (once per
    process, a warning naming the settings and the fix) when the server's own defaults leave any of
    them off (0) on this connection. Returns the settings found off."""
    global _unbounded_warned
    wanted = [k for k in _BOUNDED_WAITS if expected.get(k, "0") != "0"]
    if not wanted:
        return []
    row = await conn.fetchrow("SELECT " + ", ".join(f"current_setting('{k}') AS {k}" for k in wanted))
    off = [k for k in wanted if row[k] in ("0", "0ms", "0s")]
    if off and not _unbounded_warned:
        _unbounded_warned = True
        log.warning("%s off on %s: behind a transaction pooler z9 cannot set them per connection, so a stuck "
                    "transaction can stall others without bound; set them for z9's role (ALTER ROLE <z9 user> "
                    "SET %s = '%s', … then RECONNECT in PgBouncer; docs/settings.md, db_*_timeout_s)",
                    ", ".join(off), server_label(conn), off[0], expected[off[0]] + "ms")
    return off


def _pooled_init(require_sync_replication: bool, keepalive: tuple[int, int, int] | None = None,
                 expect_bounds: dict[str, str] | None = None) -> Any:
    async def init(conn: asyncpg.Connection) -> None:
        if keepalive is not None:
            set_client_keepalive(conn, *keepalive)
        await check_server(conn)
        if require_sync_replication:
            await check_synchronous_replication(conn)
        if expect_bounds and not _unbounded_warned:
            await warn_unbounded_waits(conn, expect_bounds)
        await init_connection(conn)
        _note_server("pool", server_label(conn))

    return init


_servers: dict[str, str] = {}  # connection kind -> the server it last reached (this process)


def _note_server(connection: str, server: str) -> None:
    """Export the server ``connection`` (``pool``/``listen``) reached; log when it changes (the
    first connection, and after a failover)."""
    from . import metrics

    metrics.database_server(connection, server)
    if _servers.get(connection) != server:
        if connection == "pool":  # the LISTEN connection logs itself (connect_listener)
            log.info("database pool connected to %s (primary)%s", server,
                     f", was {_servers[connection]}" if connection in _servers else "")
        _servers[connection] = server


async def _no_session_reset(conn: asyncpg.Connection) -> None:
    """Pool ``reset``: nothing beyond asyncpg's own rollback of an open transaction. z9 never
    leaves session state on pooled connections (no SET, LISTEN, session advisory locks or
    cursors: LISTEN and migrations use their own connections), so asyncpg's default reset
    query (``pg_advisory_unlock_all(); CLOSE ALL; UNLISTEN *; RESET ALL``) would only cost a
    round trip on every release."""
    return None


async def create_pool(
    dsn: str, *, min_size: int = 1, max_size: int = 10, application_name: str = "z9",
    pooler: str = "none", require_sync_replication: bool = False, bounds: dict[str, str] | None = None,
    keepalive: tuple[int, int, int] | None = None, commit_timeout_s: float | None = None, **kw: Any
) -> asyncpg.Pool:
    """An asyncpg pool on ``dsn`` whose connections decode jsonb and passed :func:`check_server`
    (primary, ``plan_cache_mode``; with ``require_sync_replication``,
    :func:`check_synchronous_replication`). ``pooler``: :data:`POOLERS`. Raises asyncpg/OSError errors
    when the server cannot be reached, :class:`NotPrimaryError` on a standby,
    :class:`~z9.common.errors.DatabaseMisconfigured` when ``plan_cache_mode`` is wrong."""
    if pooler not in POOLERS:
        raise ValueError(f"pooler must be one of {POOLERS}, not {pooler!r}")
    if pooler == "transaction":
        kw.setdefault("statement_cache_size", 0)
    kw.setdefault("target_session_attrs", target_session_attrs(dsn))
    with _primary_or_not():
        return await asyncpg.create_pool(
            dsn,
            connect=_connect_newest,  # the writable host on the newest timeline (dbfence)
            connection_class=dbfence.commit_bound_class(commit_timeout_s),
            min_size=min_size,
            max_size=max_size,
            init=_pooled_init(require_sync_replication, keepalive,
                              bounds if pooler != "none" else None),  # a pooler drops them: check
            reset=_no_session_reset,
            server_settings=_server_settings(application_name, pooler, bounds),
            **kw,
        )


async def _connect_newest(dsn: str, **kw: Any) -> asyncpg.Connection:
    """A pool's connect: :func:`dbfence.connect_newest`, its errors as :func:`_primary_or_not` says."""
    with _primary_or_not():
        return await dbfence.connect_newest(dsn, **kw)


def _keepalive(settings: "Settings") -> tuple[int, int, int]:
    return (settings.db_tcp_keepalives_idle_s, settings.db_tcp_keepalives_interval_s,
            settings.db_tcp_keepalives_count)


async def create_service_pool(settings: "Settings", *, application_name: str, min_size: int = 1,
                              max_size: int = 10, role: str | None = None) -> asyncpg.Pool:
    """The pooled connections of a service: ``Z9_DATABASE_URL`` through ``Z9_DATABASE_POOLER``,
    checked as ``Z9_DATABASE_REQUIRE_SYNC_REPLICATION`` says, with the bounded waits of ``role``
    (``api``/``executor``/``scheduler``; default: from ``application_name``, see
    :func:`session_bounds`)."""
    if role is None:
        role = {"z9-api": "api", "z9-executor": "executor"}.get(application_name, "scheduler")
    return await create_pool(settings.require_database_url(), min_size=min_size, max_size=max_size,
                             application_name=application_name, pooler=settings.database_pooler,
                             require_sync_replication=settings.database_require_sync_replication,
                             bounds=session_bounds(settings, role), keepalive=_keepalive(settings),
                             commit_timeout_s=settings.database_sync_commit_timeout_s)


async def connect(dsn: str, *, application_name: str = "z9", primary: bool = False,
                  require_sync_replication: bool = False, pooler: str = "none") -> asyncpg.Connection:
    """One direct connection with the jsonb codecs (migrations, tools). Not checked: ``z9 dev``
    and the tests also use it for administration. ``primary``: on a writable host of those the
    string names (:func:`target_session_attrs`; the tools that write: ``z9 migrate``, ``z9 token``,
    ``z9 quota``), else :class:`NotPrimaryError`. ``require_sync_replication``
    (``Z9_DATABASE_REQUIRE_SYNC_REPLICATION``, for those tools): :func:`check_synchronous_replication`
    as the services do — a token or a migration must not be forgotten by a failover either.
    ``pooler`` (:data:`POOLERS`): what sits in front of ``dsn`` — behind PgBouncer no startup
    parameter it does not track is sent (``plan_cache_mode``), and behind a transaction pooler no
    statement is prepared for reuse."""
    if pooler not in POOLERS:
        raise ValueError(f"pooler must be one of {POOLERS}, not {pooler!r}")
    kw: dict[str, Any] = {"target_session_attrs": target_session_attrs(dsn)} if primary else {}
    if pooler == "transaction":
        kw["statement_cache_size"] = 0
    with _primary_or_not():
        conn = await asyncpg.connect(dsn, server_settings=_server_settings(application_name, pooler), **kw)
    try:
        if require_sync_replication:
            await check_synchronous_replication(conn)
        await init_connection(conn)
    except BaseException:
        conn.terminate()
        raise
    return conn


async def connect_tool(settings: "Settings", *, application_name: str) -> asyncpg.Connection:
    """The connection of a one-shot operator tool that writes (``z9 token``, ``z9 quota``): on the
    primary, checked as ``Z9_DATABASE_REQUIRE_SYNC_REPLICATION`` says, through
    ``Z9_DATABASE_DIRECT_URL`` when set (no pooler in between), else through ``Z9_DATABASE_URL``
    as ``Z9_DATABASE_POOLER`` says (behind PgBouncer: no startup parameter it refuses)."""
    if settings.database_direct_url:
        return await connect(settings.database_direct_url, application_name=application_name, primary=True,
                             require_sync_replication=settings.database_require_sync_replication)
    return await connect(settings.require_database_url(), application_name=application_name, primary=True,
                         require_sync_replication=settings.database_require_sync_replication,
                         pooler=settings.database_pooler)


def direct_url(settings: "Settings") -> str:
    """The connection string of every LISTEN connection and of ``z9 migrate``:
    ``Z9_DATABASE_DIRECT_URL``, or ``Z9_DATABASE_URL`` when unset (no pooler in between)."""
    return settings.database_direct_url or settings.require_database_url()


async def connect_direct(settings: "Settings", *, application_name: str) -> asyncpg.Connection:
    """A direct connection (:func:`direct_url`) that passed :func:`check_server` — on the primary,
    ``plan_cache_mode`` right — and, with ``Z9_DATABASE_REQUIRE_SYNC_REPLICATION``,
    :func:`check_synchronous_replication`. Logs and exports which server it reached."""
    dsn = direct_url(settings)
    with _primary_or_not():
        conn = await dbfence.connect_newest(dsn, server_settings=_server_settings(
            application_name, bounds=session_bounds(settings, None)))
    try:
        set_client_keepalive(conn, *_keepalive(settings))
        await check_server(conn)
        if settings.database_require_sync_replication:
            await check_synchronous_replication(conn)
        await init_connection(conn)
    except BaseException:
        conn.terminate()
        raise
    return conn


async def connect_listener(settings: "Settings", *, application_name: str) -> asyncpg.Connection:
    """The LISTEN connection of a service (executor, scheduler, any other): direct, on the
    primary (:func:`connect_direct`); logged and exported (``z9_database_server_info``,
    ``connection="listen"``) with the server it reached. The caller adds its listeners."""
    conn = await connect_direct(settings, application_name=application_name)
    server = server_label(conn)
    _note_server("listen", server)
    log.info("LISTEN connection on %s (primary)", server)
    return conn


LOCK_WAIT_ERRORS: tuple[type[BaseException], ...] = (
    asyncpg.LockNotAvailableError,  # lock_timeout (SQLSTATE 55P03)
    asyncpg.QueryCanceledError,  # statement_timeout (57014)
    asyncpg.DeadlockDetectedError,  # 40P01
)
"""A statement gave up waiting for a lock another transaction holds (the connection's bounded
waits, :func:`session_bounds`), or was chosen as a deadlock's victim: nothing was written, the
transaction is rolled back; retry it later (the store raises
:class:`~z9.common.errors.LockWaitTimeout` for them)."""


TRANSIENT_DB_ERRORS: tuple[type[BaseException], ...] = (
    DatabaseUnavailable,  # what the store raises for all of the below
    asyncpg.PostgresConnectionError,  # includes ConnectionDoesNotExistError
    asyncpg.InterfaceError,  # "connection is closed", pool closing
    asyncpg.CannotConnectNowError,  # starting up / shutting down
    asyncpg.AdminShutdownError,  # terminated by the administrator
    # a new connection refused: the server is at max_connections, or the role at its limit
    # ("sorry, too many clients already", SQLSTATE 53300) — capacity, gone once others close
    asyncpg.TooManyConnectionsError,
    # The server ended the session (shutdown, pg_terminate_backend) while the connection sat idle
    # inside a transaction: asyncpg's protocol is left mid-error and the next statement (often
    # the COMMIT) raises this instead of a connection error.
    asyncpg.InternalClientError,
    ConnectionRefusedError,
    ConnectionResetError,
    FileNotFoundError,  # the Unix socket is gone (a local server stopped)
    socket.gaierror,
    TimeoutError,  # connect timeout
    NotPrimaryError,  # landed on a standby (a failover in progress): reconnect
    StaleServerError,  # an old primary back after a failover (dbfence): choose again
    # A statement reached a server that is (now) a standby or read-only: "cannot execute … in a
    # read-only transaction" / "… during recovery" (SQLSTATE 25006).
    asyncpg.ReadOnlySQLTransactionError,
    # A migration changed what a prepared statement returns (0014: columns retyped to domains):
    # "cached plan must not change result type". Refused before it ran; asyncpg has dropped the
    # pool's statement cache and prepares it again by itself outside a transaction — inside one the
    # transaction is rolled back, and running it again works.
    asyncpg.InvalidCachedStatementError,
    # (asyncpg.OutdatedSchemaCacheError, a result asyncpg could not decode after a type changed,
    # is an InternalClientError above: the statement did run — z9 returns no composite of a
    # changed table.)
)
"""Errors meaning "the database is unreachable right now": services back off and reconnect. The
store translates them into :class:`~z9.common.errors.DatabaseUnavailable`; the tuple is what
services catch around the few database calls that are not the store's (pool creation, LISTEN
connections, a transaction's COMMIT)."""


def is_stale_statement(exc: BaseException) -> bool:
    """``exc`` (or the asyncpg error the store translated into it) is a prepared statement a schema
    change invalidated (``asyncpg.InvalidCachedStatementError``, see :data:`TRANSIENT_DB_ERRORS`):
    nothing ran, and running the transaction again at once works."""
    return isinstance(exc, asyncpg.InvalidCachedStatementError) or (
        isinstance(exc, DatabaseUnavailable) and isinstance(exc.__cause__, asyncpg.InvalidCachedStatementError))
