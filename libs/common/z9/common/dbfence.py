"""Fence by timeline: of the hosts a connection string names, z9 uses only the writable one on the
newest timeline, and never again a writable host of an older timeline or of another system.

A failover promotes a standby: it starts a new timeline (the number in its WAL file names grows by
one) and keeps the cluster's *system identifier* (``pg_control_system()``; a standby is a copy of
its primary). An old primary that comes back writable without being fenced (restarted by hand, by
a service manager, after a partition) is still on the old timeline: both hosts accept writes, and
``target_session_attrs=read-write`` keeps the first of them in the list — the old primary, when the
list names it first. A job claimed there, a clone ledger read there, is a second truth.

So a service with several hosts in its URL connects to **every** host (at once), reads each one's
``(system identifier, timeline)`` and recovery state, and keeps the writable host on the newest
timeline (:func:`connect_newest`). Every connection z9 opens — of several hosts or of one, behind
a pooler too — is then judged against the newest identity this process has used
(:data:`FENCE`): a writable host on an older timeline (split brain) or of another system is
refused with :class:`StaleServerError` — logged, counted in
``z9_database_refusals_total{reason}`` (alert ``Z9DatabaseSplitBrain``) — a transient error, so
the service backs off and chooses again. The memory is per process: a service started while only
the old primary answers has nothing to compare with (the deployment must fence it: README,
production section).

The timeline of a writable host is that of its current WAL file (``pg_walfile_name``'s first eight
hex digits: the timeline it writes on now); ``pg_control_checkpoint()`` would lag behind a
promotion until the next checkpoint.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg

log = logging.getLogger("z9.db")

IDENTITY_SQL = (
    "SELECT pg_catalog.pg_is_in_recovery() AS recovery,"
    " current_setting('transaction_read_only') AS read_only,"
    " CASE WHEN pg_catalog.pg_is_in_recovery() THEN NULL"
    " ELSE ('x' || substr(pg_catalog.pg_walfile_name(pg_catalog.pg_current_wal_lsn()), 1, 8))::bit(32)::int"
    " END AS timeline")
#: the system identifier, read from the server's pg_control file: a server that cannot read it (a
#: data directory whose file modes were changed under it) leaves it unknown, and then only timelines
#: are compared
SYSTEM_SQL = "SELECT system_identifier FROM pg_catalog.pg_control_system()"


class StaleServerError(ConnectionError):
    """A writable host on an older timeline than this process has used (an old primary back
    after a failover) or of another system: refused. Transient — the service chooses again."""

    def __init__(self, message: str, reason: str):
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True, order=True)
class ServerIdentity:
    """A writable host's ``(system identifier, timeline)``."""

    system: int | None  # None: not readable on that server
    timeline: int

    def __str__(self) -> str:
        return f"system {self.system if self.system is not None else '?'} timeline {self.timeline}"


async def identify(conn: asyncpg.Connection) -> tuple[bool, ServerIdentity | None]:
    """(writable, identity) of the server ``conn`` reached (identity None on a standby)."""
    row = await conn.fetchrow(IDENTITY_SQL)
    writable = not row["recovery"] and row["read_only"] != "on"
    if row["timeline"] is None:
        return writable, None
    try:
        system: int | None = int(await conn.fetchval(SYSTEM_SQL))
    except asyncpg.PostgresError as e:
        log.debug("system identifier not readable (%s)", e)
        system = None
    return writable, ServerIdentity(system, int(row["timeline"]))


def _same_system(a: ServerIdentity, b: ServerIdentity) -> bool:
    return a.system is None or b.system is None or a.system == b.system


class Fence:
    """The newest (system, timeline) this process has used through each connection string (keyed by
    its host list: a service's pooled and direct strings may name a pooler and the servers), and
    the judge of every other."""

    def __init__(self) -> None:
        self.newest: dict[tuple[str, ...], ServerIdentity] = {}

    def reset(self) -> None:
        """Forget (a test that builds new clusters on ports another test used)."""
        self.newest.clear()

    def judge(self, key: tuple[str, ...], ident: ServerIdentity, server: str) -> None:
        """Accept ``ident`` (and remember it when it is newer), or raise :class:`StaleServerError`."""
        from . import metrics

        newest = self.newest.get(key)
        if newest is not None and not _same_system(ident, newest):
            reason, why = "other_system", f"is another database system than the one z9 used ({newest})"
        elif newest is not None and ident.timeline < newest.timeline:
            reason, why = "older_timeline", (f"is writable on timeline {ident.timeline}, older than timeline "
                                             f"{newest.timeline} z9 used: an old primary back after a failover "
                                             "(split brain) — fence it")
        else:
            if newest != ident:
                log.info("database %s: %s%s", server, ident, f" (was {newest})" if newest else "")
            self.newest[key] = ident
            metrics.database_timeline(max(i.timeline for i in self.newest.values()))
            return
        metrics.database_refused(reason)
        log.error("refusing database server %s (%s): it %s", server, ident, why)
        raise StaleServerError(f"database server {server} ({ident}) {why}", reason)


#: this process's memory (every pool, LISTEN connection and tool of the process shares it)
FENCE = Fence()


def hosts_of(dsn: str) -> list[str]:
    """The ``host:port`` entries of ``dsn``'s host list (one for a single-host string)."""
    netloc = urlsplit(dsn).netloc
    hostlist = netloc.rpartition("@")[2]
    return [h for h in hostlist.split(",") if h] or [""]


def with_host(dsn: str, host: str) -> str:
    """``dsn`` naming only ``host`` (and without ``target_session_attrs``: every host is probed)."""
    parts = urlsplit(dsn)
    userinfo, at, _ = parts.netloc.rpartition("@")
    query = "&".join(p for p in parts.query.split("&") if p and not p.startswith("target_session_attrs="))
    return urlunsplit((parts.scheme, f"{userinfo}{at}{host}", parts.path, query, parts.fragment))


async def connect_newest(dsn: str, **kw: Any) -> asyncpg.Connection:
    """A connection to the writable host of ``dsn`` on the newest timeline (module docstring),
    judged by :data:`FENCE`. With one host: that host, judged. ``kw``: asyncpg.connect's (``loop``,
    ``connection_class``… as a pool passes them; ``target_session_attrs`` is replaced: each host is
    probed as it is). Raises what asyncpg raises when no host answers, :class:`NotWritable` when no
    host accepts writes, :class:`StaleServerError` when the only writable ones are stale."""
    kw.pop("target_session_attrs", None)
    hosts = hosts_of(dsn)
    key = tuple(sorted(hosts))
    if len(hosts) == 1:
        conn = await asyncpg.connect(dsn, **kw)
        try:
            writable, ident = await identify(conn)
            if writable and ident is not None:  # a standby: the caller's own check refuses it
                FENCE.judge(key, ident, hosts[0])
        except BaseException:
            conn.terminate()
            raise
        return conn
    results = await asyncio.gather(*(asyncpg.connect(with_host(dsn, h), **kw) for h in hosts),
                                   return_exceptions=True)
    conns = [(h, c) for h, c in zip(hosts, results) if isinstance(c, asyncpg.Connection)]
    keep: asyncpg.Connection | None = None
    try:
        candidates: list[tuple[ServerIdentity, str, asyncpg.Connection]] = []
        for h, c in conns:
            try:
                writable, ident = await identify(c)
            except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError) as e:  # not a candidate
                log.warning("database host %s: cannot read its identity (%s)", h, e)
                continue
            if writable and ident is not None:
                candidates.append((ident, h, c))
        if not candidates:
            if not conns:  # no host answered: the first error says why
                raise next(r for r in results if isinstance(r, BaseException))
            raise NotWritable(f"no host of {', '.join(hosts)} accepts writes (each a standby or read-only)")
        newest = FENCE.newest.get(key)
        # the remembered system first, then the newest timeline; the others are judged (refused)
        candidates.sort(key=lambda t: (newest is None or _same_system(t[0], newest), t[0].timeline), reverse=True)
        best, host, conn = candidates[0]
        for ident, h, _ in candidates[1:]:
            if _same_system(ident, best) and ident.timeline < best.timeline:
                from . import metrics

                metrics.database_refused("older_timeline")
                log.error("refusing database server %s (%s): writable on an older timeline than %s (%s) — an old "
                          "primary back after a failover (split brain); fence it", h, ident, host, best)
            elif not _same_system(ident, best):
                from . import metrics

                metrics.database_refused("other_system")
                log.error("refusing database server %s (%s): another database system than %s (%s)", h, ident,
                          host, best)
        FENCE.judge(key, best, host)
        keep = conn
        return conn
    finally:
        for _, c in conns:
            if c is not keep:
                c.terminate()


class NotWritable(ConnectionError):
    """No host of the list accepts writes."""


class CommitBoundConnection(asyncpg.Connection):  # type: ignore[misc]
    """A pooled connection whose commits have a bound: a ``COMMIT`` — or a statement outside a
    transaction, which commits as it ends — without an answer after :attr:`commit_timeout_s`
    (``Z9_DATABASE_SYNC_COMMIT_TIMEOUT_S``) is abandoned: the connection is closed and the error is
    a lost connection's (its outcome unknown; the pool chooses the host again for the next one).
    A commit that waits on synchronous replication waits for a standby that may never come (an old
    primary restarted writable, its standby gone): PostgreSQL's own ``statement_timeout`` would end
    that wait with a *success* and a warning ("canceling wait for synchronous replication … the
    transaction has already committed locally") — an answer z9 must not take as durable."""

    commit_timeout_s: float | None = None

    def _bound(self, query: str, timeout: float | None) -> tuple[float | None, bool]:
        limit = self.commit_timeout_s
        if not limit:
            return timeout, False
        commits = not self.is_in_transaction() or query.lstrip()[:6].upper() == "COMMIT"
        if not commits or (timeout is not None and timeout <= limit):
            return timeout, False
        return limit, True

    async def execute(self, query: str, *args: Any, timeout: float | None = None) -> str:
        bound, bounded = self._bound(query, timeout)
        if not bounded:
            return await super().execute(query, *args, timeout=timeout)
        try:
            return await super().execute(query, *args, timeout=bound)
        except TimeoutError:
            self._abandon(query)
            raise

    async def _execute(self, query: Any, args: Any, limit: Any, timeout: float | None, **kw: Any) -> Any:
        bound, bounded = self._bound(query if isinstance(query, str) else "", timeout)
        if not bounded:
            return await super()._execute(query, args, limit, timeout, **kw)
        try:
            return await super()._execute(query, args, limit, bound, **kw)
        except TimeoutError:
            self._abandon(query if isinstance(query, str) else "")
            raise

    def _abandon(self, query: str) -> None:
        from . import metrics
        from .db import server_label

        metrics.database_abandoned()
        log.error("database %s: no answer to a commit after %.0fs (waiting on synchronous replication?); "
                  "abandoning the connection, its outcome unknown (%s)", server_label(self),
                  self.commit_timeout_s or 0, query.strip().split("\n")[0][:80])
        self.terminate()


def commit_bound_class(timeout_s: float | None) -> type[CommitBoundConnection]:
    """A :class:`CommitBoundConnection` class with ``timeout_s`` (None or 0: unbounded)."""
    return type("CommitBoundConnection", (CommitBoundConnection,), {"commit_timeout_s": timeout_s or None})
