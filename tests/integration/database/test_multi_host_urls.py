"""a connection string naming several hosts without ``target_session_attrs``.

asyncpg's default is ``any``: it keeps the first host that answers. z9 refuses a standby itself
(NotPrimaryError, transient), but the retry reaches the same first host again — so after a failover
that turned the first-listed host into a standby (the old primary rejoined), every service backs off
forever against the standby instead of moving to the new primary named second.
"""
from __future__ import annotations

import os

from z9.common.db import connect_listener, create_service_pool, server_label
from z9.common.settings import Settings

from tests.pgcluster import PgServer
from tests.acceptance.test_ha import pair  # noqa: F401  (the fixture; skips this module as it skips test_ha)


def _hosts(*servers: PgServer, query: str = "") -> str:
    return "postgresql://postgres@" + ",".join(f"127.0.0.1:{s.port}" for s in servers) + "/postgres" + query


async def test_several_hosts_without_target_session_attrs_reach_the_primary(
        pair: tuple[PgServer, PgServer]) -> None:
    primary, standby = pair
    for url in (_hosts(standby, primary), _hosts(standby, primary, query="?target_session_attrs=any"),
                _hosts(standby, primary, query="?sslmode=disable")):
        conn = await connect_listener(Settings(database_url=url), application_name="t")
        try:
            assert server_label(conn) == f"127.0.0.1:{primary.port}", url
        finally:
            await conn.close()
        pool = await create_service_pool(Settings(database_url=url), application_name="z9-api", max_size=2)
        try:
            async with pool.acquire() as c:
                assert await c.fetchval("SELECT pg_is_in_recovery()") is False, url
        finally:
            await pool.close()
    # 'primary' as asked stays 'primary'
    conn = await connect_listener(Settings(database_url=_hosts(standby, primary, query="?target_session_attrs=primary")),
                                  application_name="t")
    assert server_label(conn) == f"127.0.0.1:{primary.port}"
    await conn.close()


def test_migrate_with_several_hosts_reaches_the_primary(pair: tuple[PgServer, PgServer]) -> None:
    """``z9 migrate`` (the Kubernetes Job, an operator) with the same string as the services: the
    standby listed first must not be where it tries to create the schema."""
    import subprocess
    import sys

    primary, standby = pair
    env = {k: v for k, v in os.environ.items() if not k.startswith("Z9_")}
    env["Z9_DATABASE_URL"] = _hosts(standby, primary)
    out = subprocess.run([sys.executable, "-m", "z9", "migrate"], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
