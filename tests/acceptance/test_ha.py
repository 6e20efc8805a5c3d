"""Highly available PostgreSQL (issue 13 §1): a primary and a synchronous standby built from
Debian's binaries (``tests/pgcluster.py``), z9 connecting with a two-host connection string.

- The checks every z9 connection passes: a LISTEN never lands on a standby, whatever the host
  order and whether or not the string says ``target_session_attrs``; the synchronous
  replication check passes on the primary and refuses a server that commits alone.
- The failover, reduced (``tests/failover_scenario.py``; the long form is ``bench/failover.py``):
  real z9 processes, the primary SIGKILLed mid-run, the standby promoted: no job lost, none run
  twice at once, no committed row gone, every service on the new primary.

Skipped when Debian's PostgreSQL binaries are missing (``/usr/lib/postgresql/<v>/bin``), unless
``Z9_REQUIRE_HA=1`` (``.ci/run`` sets it).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import AsyncIterator

import asyncpg
import pytest

from z9.common.db import NotPrimaryError, check_synchronous_replication, connect_listener, server_label
from z9.common.errors import DatabaseMisconfigured
from z9.common.settings import Settings

from tests import failover_scenario
from tests.pgcluster import PgServer, pg_bindir, primary_and_standby, remove_workdir, wait_sync_standby
from tests.support import SimAdmin

if pg_bindir() is None:
    if os.environ.get("Z9_REQUIRE_HA") == "1":
        raise RuntimeError("Z9_REQUIRE_HA=1 but no PostgreSQL binaries under /usr/lib/postgresql")
    pytest.skip("Debian's PostgreSQL binaries (/usr/lib/postgresql/<v>/bin) are not installed",
                allow_module_level=True)


@pytest.fixture
async def pair() -> AsyncIterator[tuple[PgServer, PgServer]]:
    primary, standby = primary_and_standby()
    try:
        wait_sync_standby(primary)
        yield primary, standby
    finally:
        standby.stop()
        primary.stop()
        remove_workdir(primary.datadir.parent)


def _hosts(*servers: PgServer, attrs: str | None = "read-write") -> str:
    hosts = ",".join(f"127.0.0.1:{s.port}" for s in servers)
    return f"postgresql://postgres@{hosts}/postgres" + (f"?target_session_attrs={attrs}" if attrs else "")


async def test_listen_connections_land_on_the_primary_only(pair: tuple[PgServer, PgServer]) -> None:
    primary, standby = pair
    # Standby first in the list: target_session_attrs=read-write skips it.
    s = Settings(database_url=_hosts(standby, primary))
    conn = await connect_listener(s, application_name="t")
    try:
        assert server_label(conn) == f"127.0.0.1:{primary.port}"
        assert await conn.fetchval("SELECT pg_is_in_recovery()") is False
    finally:
        await conn.close()
    # Without target_session_attrs z9 asks for a writable host itself (asyncpg's default 'any'
    # would keep the standby listed first, every retry); a standby alone is refused (transient:
    # the service retries) instead of issuing LISTEN there.
    conn = await connect_listener(Settings(database_url=_hosts(standby, primary, attrs=None)), application_name="t")
    assert server_label(conn) == f"127.0.0.1:{primary.port}"
    await conn.close()
    with pytest.raises(NotPrimaryError, match="standby"):
        await connect_listener(Settings(database_url=_hosts(standby, attrs=None)), application_name="t")
    # The direct URL wins over the pooled one for LISTEN.
    s = Settings(database_url=_hosts(standby, attrs=None), database_direct_url=_hosts(primary, attrs=None))
    conn = await connect_listener(s, application_name="t")
    assert server_label(conn) == f"127.0.0.1:{primary.port}"
    await conn.close()


async def test_synchronous_replication_check(pair: tuple[PgServer, PgServer]) -> None:
    primary, standby = pair
    conn = await asyncpg.connect(primary.url())
    try:
        await check_synchronous_replication(conn)  # synchronous_standby_names='*', commit on
        await conn.execute("SET synchronous_commit = local")
        with pytest.raises(DatabaseMisconfigured, match="synchronous_commit='local'"):
            await check_synchronous_replication(conn)
    finally:
        await conn.close()
    # The standby, promoted, commits alone: a service requiring sync replication refuses it.
    standby.promote()
    s = Settings(database_url=_hosts(standby), database_require_sync_replication=True)
    with pytest.raises(DatabaseMisconfigured, match="commits without waiting for a standby"):
        await connect_listener(s, application_name="t")


async def test_failover_loses_nothing_and_every_service_moves_to_the_new_primary(
        tmp_path: Path, settings: Settings, sim: SimAdmin) -> None:
    before = int(os.environ.get("Z9_FAILOVER_BEFORE", "6"))
    after = int(os.environ.get("Z9_FAILOVER_AFTER", "4"))
    fig = await failover_scenario.run(tmp_path, settings, sim, before=before, after=after)
    print(fig)
    assert fig.accepted == before + after
    assert fig.jobs_lost == 0, fig.detail
    assert fig.committed_rows_disappeared == 0, fig.detail
    assert fig.jobs_run_twice_at_once == 0, fig.detail
    assert fig.servers_without_exactly_one_vm == 0, fig.detail
    assert fig.duplicate_clones == 0, fig.detail
    assert fig.listen_on_new_primary_s == fig.listen_on_new_primary_s  # measured (not NaN)
    assert fig.first_new_job_succeeded_s == fig.first_new_job_succeeded_s
    assert "executor metrics do not name the new primary" not in fig.detail


async def test_an_old_primary_back_unfenced_takes_nothing(tmp_path: Path, settings: Settings, sim: SimAdmin) -> None:
    """The old primary restarted writable after the failover, listed first in every service's URL,
    every z9 connection reset and an executor restarted: each service stays on (or goes back to) the
    new primary — the writable host on the newest timeline — and refuses the old one (logged);
    nothing is claimed or written there, every job succeeds, one VM per server."""
    fig = await failover_scenario.run_old_primary_back(tmp_path, settings, sim)
    print(fig)
    assert fig.jobs_lost == 0, fig.detail
    assert fig.old_primary_writes == 0, fig.detail
    assert fig.jobs_run_twice_at_once == 0, fig.detail
    assert fig.servers_without_exactly_one_vm == 0, fig.detail
    assert fig.duplicate_clones == 0, fig.detail
    assert fig.refusals_logged > 0, fig.detail


async def test_a_writable_host_on_an_older_timeline_is_refused(pair: tuple[PgServer, PgServer]) -> None:
    """Fence by timeline (z9.common.dbfence), one host list: before the failover the primary; after,
    the promoted standby (timeline 2); the old primary back writable is refused — while the new one
    answers (the newest timeline wins, whatever the order) and when it is alone (remembered)."""
    from z9.common import metrics
    from z9.common.dbfence import FENCE, StaleServerError

    primary, standby = pair
    s = Settings(database_url=_hosts(primary, standby))
    conn = await connect_listener(s, application_name="t")
    assert server_label(conn) == f"127.0.0.1:{primary.port}"
    await conn.close()
    primary.kill()
    standby.promote()
    conn = await connect_listener(s, application_name="t")
    assert server_label(conn) == f"127.0.0.1:{standby.port}"
    await conn.close()
    assert [i.timeline for i in FENCE.newest.values()] == [2]
    primary.start_again()  # back, writable, on timeline 1, listed first
    refused = metrics.DATABASE_REFUSALS.labels("older_timeline")._value.get()
    conn = await connect_listener(s, application_name="t")
    assert server_label(conn) == f"127.0.0.1:{standby.port}"
    await conn.close()
    assert metrics.DATABASE_REFUSALS.labels("older_timeline")._value.get() == refused + 1
    standby.stop()  # only the old primary answers: refused, not used
    with pytest.raises(StaleServerError, match="older than timeline 2"):
        await connect_listener(s, application_name="t")


async def test_a_commit_waiting_on_a_gone_standby_is_abandoned(pair: tuple[PgServer, PgServer]) -> None:
    """The synchronous standby is gone: a commit waits in SyncRep. A pooled connection abandons it
    after the bound (Z9_DATABASE_SYNC_COMMIT_TIMEOUT_S) — a statement outside a transaction and an
    explicit COMMIT alike —, closes the connection, and the pool opens a new one."""
    from z9.common import metrics
    from z9.common.db import create_pool

    primary, standby = pair
    pool = await create_pool(primary.url(), min_size=1, max_size=1, commit_timeout_s=1.0)
    try:
        await pool.execute("CREATE TABLE t (x int)")  # committed while the standby answers
        pid = await pool.fetchval("SELECT pg_backend_pid()")
        standby.stop()
        abandoned = metrics.DATABASE_ABANDONED._value.get()
        with pytest.raises(TimeoutError):
            await pool.execute("INSERT INTO t VALUES (1)")
        assert metrics.DATABASE_ABANDONED._value.get() == abandoned + 1
        assert await pool.fetchval("SELECT pg_backend_pid()") != pid  # a new connection
        with pytest.raises(TimeoutError):
            async with pool.acquire() as conn, conn.transaction():
                await conn.execute("INSERT INTO t VALUES ($1)", 2)  # inside: not bounded
        assert metrics.DATABASE_ABANDONED._value.get() == abandoned + 2
        assert await pool.fetchval("SELECT count(*) FROM t") == 0  # a read needs no standby
    finally:
        pool.terminate()
