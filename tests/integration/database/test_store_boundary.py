"""The store is the one PostgreSQL error boundary: a unique violation is a typed error naming its
constraint, a lost connection one DatabaseUnavailable; asyncpg's types do not leak."""
from __future__ import annotations

import asyncpg
import pytest

from z9.common import store
from z9.common.db import create_pool
from z9.common.errors import DatabaseUnavailable, UniqueViolation

from tests.support import make_tenant
from z9.resources.server import store as server_store


async def test_a_unique_violation_names_its_constraint(pool: asyncpg.Pool) -> None:
    tenant, _ = await make_tenant(pool, "acme")
    spec = dict(tenant_id=tenant, region="dev-1", name="a", image="debian-12", cores=1, memory_mib=1024,
                disk_gib=4, ssh_keys=[])
    await server_store.server_insert(pool, **spec)
    with pytest.raises(UniqueViolation) as ei:
        await server_store.server_insert(pool, **spec)
    assert ei.value.constraint == "servers_tenant_name_live"
    assert not isinstance(ei.value, asyncpg.PostgresError)


async def test_a_lost_connection_is_database_unavailable(db_url: str) -> None:
    p = await create_pool(db_url, min_size=1, max_size=1)
    conn = await p.acquire()
    pid = conn.get_server_pid()
    killer = await asyncpg.connect(db_url)
    try:
        await killer.fetchval("SELECT pg_terminate_backend($1)", pid)
        with pytest.raises(DatabaseUnavailable):
            await store.job_get(conn, "job_01jd3x5v8q2m6n4p7r9s1t3w5y")
    finally:
        await killer.close()
        await p.release(conn)
        await p.close()
    with pytest.raises(DatabaseUnavailable):  # a closed pool, too
        await store.job_get(p, "job_01jd3x5v8q2m6n4p7r9s1t3w5y")


async def test_a_connection_refused_for_too_many_clients_is_database_unavailable(pool: asyncpg.Pool,
                                                                                 db_url: str) -> None:
    """PostgreSQL at max_connections (or a role's connection limit) refuses a new connection with
    SQLSTATE 53300 'sorry, too many clients already': the database is unavailable right now, not
    an internal error (an API answered 500 and a service's loop did not back off). Reproduced
    with a role whose connection limit is 0."""
    import secrets
    from urllib.parse import urlsplit, urlunsplit

    from z9.common.db import TRANSIENT_DB_ERRORS
    role = f"z9_test_nolimit_{secrets.token_hex(4)}"
    await pool.execute(f"CREATE ROLE {role} LOGIN CONNECTION LIMIT 0")
    u = urlsplit(db_url)
    url = urlunsplit(u._replace(netloc=f"{role}@{u.hostname}:{u.port or 5432}"))
    p = await create_pool(url, min_size=0, max_size=1)
    try:
        with pytest.raises(DatabaseUnavailable):
            await store.job_get(p, "job_01jd3x5v8q2m6n4p7r9s1t3w5y")
        with pytest.raises(TRANSIENT_DB_ERRORS):  # a service's own acquire, outside the store
            async with p.acquire():
                pass
    finally:
        await p.close()
        await pool.execute(f"DROP ROLE {role}")
