"""Every named query in ``libs/common/queries.sql`` is one statement PostgreSQL accepts against the
migrated schema (``PREPARE``: parsed, planned, never run). A merge that interleaves two queries
(a ``RETURNING`` of one left under another) fails here, not in the first job that uses it."""
from __future__ import annotations

import asyncpg

import z9.api.app  # noqa: F401  (registers every resource type)
from z9.common import resources
from z9.common.sql import queries, qt


async def test_every_named_query_prepares(pool: asyncpg.Pool) -> None:
    types = list(resources.REGISTRY.values())
    assert types
    bad = []
    async with pool.acquire() as conn:
        for name, text in queries().items():
            if "{table}" in text or "{status_type}" in text:
                texts = [(f"{name}[{rt.table}]", qt(name, rt.table, rt.status_type)) for rt in types]
            else:
                texts = [(name, text)]
            for label, sql in texts:
                try:
                    await conn.prepare(sql)
                except asyncpg.PostgresError as e:
                    bad.append(f"{label}: {type(e).__name__}: {e}")
    assert not bad, "\n".join(bad)
