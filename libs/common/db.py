"""PostgreSQL connections: asyncpg pools with JSON codecs, and the LISTEN channel names."""
from __future__ import annotations

import json
import socket
from typing import Any

import asyncpg

from .errors import DatabaseUnavailable

JOBS_CHANNEL = "z9_jobs"  # payload: the region whose jobs became claimable
SCHEDULER_CHANNEL = "z9_scheduler"  # a job entered `retry`; the scheduler recomputes its sleep

PLAN_CACHE_MODE: str | None = "force_custom_plan"
"""``plan_cache_mode`` of every z9 connection (None: the server's default, ``auto``). asyncpg
prepares every statement; under ``auto`` PostgreSQL switches a statement to a generic plan after
five executions when that plan looks no dearer — and on the queue's partial indexes a generic
plan built while the table looked empty can be a sequential scan. Custom plans cost a planning
per execution (tens of µs for z9's hot queries) and keep the plan right for the parameters and
the table as it is now; bench/README.md has the measurements."""


def _server_settings(application_name: str) -> dict[str, str]:
    out = {"application_name": application_name}
    if PLAN_CACHE_MODE:
        out["plan_cache_mode"] = PLAN_CACHE_MODE
    return out


async def init_connection(conn: asyncpg.Connection) -> None:
    """Register json/jsonb codecs so jsonb columns read and write as Python objects."""
    for typ in ("json", "jsonb"):
        await conn.set_type_codec(typ, encoder=json.dumps, decoder=json.loads, schema="pg_catalog")


async def _no_session_reset(conn: asyncpg.Connection) -> None:
    """Pool ``reset``: nothing beyond asyncpg's own rollback of an open transaction. z9 never
    leaves session state on pooled connections (no SET, LISTEN, session advisory locks or
    cursors: LISTEN and migrations use their own connections), so asyncpg's default reset
    query (``pg_advisory_unlock_all(); CLOSE ALL; UNLISTEN *; RESET ALL``) would only cost a
    round trip on every release."""
    return None


async def create_pool(
    dsn: str, *, min_size: int = 1, max_size: int = 10, application_name: str = "z9", **kw: Any
) -> asyncpg.Pool:
    """An asyncpg pool on ``dsn`` whose connections decode jsonb. Raises asyncpg/OSError errors
    when the server cannot be reached."""
    return await asyncpg.create_pool(
        dsn,
        min_size=min_size,
        max_size=max_size,
        init=init_connection,
        reset=_no_session_reset,
        server_settings=_server_settings(application_name),
        **kw,
    )


async def connect(dsn: str, *, application_name: str = "z9") -> asyncpg.Connection:
    """One connection with the jsonb codecs (LISTEN connections, migrations, tools)."""
    conn = await asyncpg.connect(dsn, server_settings=_server_settings(application_name))
    await init_connection(conn)
    return conn


TRANSIENT_DB_ERRORS: tuple[type[BaseException], ...] = (
    DatabaseUnavailable,  # what the store raises for all of the below
    asyncpg.PostgresConnectionError,  # includes ConnectionDoesNotExistError
    asyncpg.InterfaceError,  # "connection is closed", pool closing
    asyncpg.CannotConnectNowError,  # starting up / shutting down
    asyncpg.AdminShutdownError,  # terminated by the administrator
    # The server ended the session (shutdown, pg_terminate_backend) while the connection sat idle
    # inside a transaction: asyncpg's protocol is left mid-error and the next statement (often
    # the COMMIT) raises this instead of a connection error.
    asyncpg.InternalClientError,
    ConnectionRefusedError,
    ConnectionResetError,
    FileNotFoundError,  # the Unix socket is gone (a local server stopped)
    socket.gaierror,
    TimeoutError,  # connect timeout
)
"""Errors meaning "the database is unreachable right now": services back off and reconnect. The
store translates them into :class:`~z9.common.errors.DatabaseUnavailable`; the tuple is what
services catch around the few database calls that are not the store's (pool creation, LISTEN
connections, a transaction's COMMIT)."""
