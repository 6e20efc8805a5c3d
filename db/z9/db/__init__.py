"""Schema migrations: numbered SQL files in ``db/z9/db/migrations`` (``NNNN_name.sql``).

:func:`migrate` applies the ones a database lacks, each in its own transaction, under a
session advisory lock, so it is safe to run concurrently and repeatedly (``z9 migrate``).
``db/z9/db/schema.sql`` is the snapshot of the resulting schema; :func:`describe_schema` gives a
comparable description of a live database so a test can prove the two agree.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources

import asyncpg

MIGRATE_LOCK_KEY = 0x7A39_6D69  # "z9mi": the advisory lock every migrator takes
_NAME_RE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


@dataclass(frozen=True)
class Migration:
    """One migration file: ``version`` (int), ``name`` and its SQL text."""

    version: int
    name: str
    sql: str


def list_migrations() -> list[Migration]:
    """All migrations shipped with z9, in version order. Raises ``ValueError`` on a bad file name
    or a duplicate version."""
    out: dict[int, Migration] = {}
    for entry in resources.files("z9.db").joinpath("migrations").iterdir():
        if not entry.name.endswith(".sql"):
            continue
        m = _NAME_RE.match(entry.name)
        if not m:
            raise ValueError(f"migration file name {entry.name!r} is not NNNN_name.sql")
        version = int(m.group(1))
        if version in out:
            raise ValueError(f"two migrations with version {version}")
        out[version] = Migration(version, m.group(2), entry.read_text())
    return [out[v] for v in sorted(out)]


def schema_snapshot() -> str:
    """The text of ``db/z9/db/schema.sql``."""
    return resources.files("z9.db").joinpath("schema.sql").read_text()


async def migrate(conn: asyncpg.Connection) -> list[int]:
    """Apply every missing migration; return the versions applied by this call (maybe none).

    Holds ``pg_advisory_lock(MIGRATE_LOCK_KEY)`` for the duration, so concurrent callers
    serialise and the later ones find nothing to do.
    """
    applied_now: list[int] = []
    # No bounded waits while migrating: behind PgBouncer the services' lock_timeout,
    # statement_timeout and idle_in_transaction_session_timeout are the role's defaults
    # (docs/settings.md), which this direct connection of the same role inherits. A migration
    # runs as long as its data needs (an index over millions of jobs), and another migrator
    # waits for it on the migrate lock. The session's own values come back afterwards.
    saved = await conn.fetchrow(
        "SELECT current_setting('lock_timeout') AS lock_timeout,"
        " current_setting('statement_timeout') AS statement_timeout,"
        " current_setting('idle_in_transaction_session_timeout') AS idle_in_transaction_session_timeout")
    await conn.execute("SET lock_timeout = 0; SET statement_timeout = 0; SET idle_in_transaction_session_timeout = 0")
    try:
        await _migrate_locked(conn, applied_now)
    finally:
        if not conn.is_closed():
            await conn.execute("SELECT set_config(name, value, false) FROM unnest($1::text[], $2::text[]) AS s(name, value)",
                               list(saved.keys()), list(saved.values()))
    return applied_now


async def _migrate_locked(conn: asyncpg.Connection, applied_now: list[int]) -> None:
    await conn.execute("SELECT pg_advisory_lock($1)", MIGRATE_LOCK_KEY)
    try:
        await conn.execute(
            """CREATE TABLE IF NOT EXISTS schema_migrations (
                   version    integer PRIMARY KEY,
                   name       text NOT NULL,
                   applied_at timestamptz NOT NULL DEFAULT now())"""
        )
        done = {r["version"] for r in await conn.fetch("SELECT version FROM schema_migrations")}
        for mig in list_migrations():
            if mig.version in done:
                continue
            async with conn.transaction():
                await conn.execute(mig.sql)
                await conn.execute(
                    "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)",
                    mig.version,
                    mig.name,
                )
            applied_now.append(mig.version)
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1)", MIGRATE_LOCK_KEY)


_DESCRIBE = {
    "columns": """
        SELECT c.relname || '.' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod)
               || CASE WHEN a.attnotnull THEN ' NOT NULL' ELSE '' END
               || coalesce(' DEFAULT ' || pg_get_expr(d.adbin, d.adrelid), '')
               || CASE WHEN a.attidentity <> '' THEN ' IDENTITY ' || a.attidentity::text ELSE '' END
        FROM pg_attribute a
        JOIN pg_class c ON c.oid = a.attrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
        WHERE n.nspname = 'public' AND c.relkind = 'r' AND a.attnum > 0 AND NOT a.attisdropped
          AND c.relname <> 'schema_migrations'""",
    "constraints": """
        SELECT c.relname || ' ' || pg_get_constraintdef(k.oid)
        FROM pg_constraint k JOIN pg_class c ON c.oid = k.conrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = 'public' AND c.relname <> 'schema_migrations'""",
    "indexes": """
        SELECT indexdef FROM pg_indexes
        WHERE schemaname = 'public' AND tablename <> 'schema_migrations'""",
    "enums": """
        SELECT t.typname || ' ' || string_agg(e.enumlabel, ',' ORDER BY e.enumsortorder)
        FROM pg_type t JOIN pg_enum e ON e.enumtypid = t.oid
        JOIN pg_namespace n ON n.oid = t.typnamespace
        WHERE n.nspname = 'public' GROUP BY t.typname""",
    "domains": """
        SELECT t.typname || ' ' || format_type(t.typbasetype, t.typtypmod)
               || coalesce(' ' || string_agg(k.conname || ' ' || pg_get_constraintdef(k.oid)
                                             || CASE WHEN k.convalidated THEN '' ELSE ' NOT VALID' END,
                                             ', ' ORDER BY k.conname), '')
        FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
        LEFT JOIN pg_constraint k ON k.contypid = t.oid
        WHERE n.nspname = 'public' AND t.typtype = 'd'
        GROUP BY t.oid, t.typname, t.typbasetype, t.typtypmod""",
    "functions": """
        SELECT p.proname || ' ' || md5(pg_get_functiondef(p.oid))
        FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'public'""",
    "triggers": """
        SELECT pg_get_triggerdef(t.oid) FROM pg_trigger t
        JOIN pg_class c ON c.oid = t.tgrelid JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = 'public' AND NOT t.tgisinternal""",
}


async def describe_schema(conn: asyncpg.Connection) -> dict[str, list[str]]:
    """A sorted, comparable description of the ``public`` schema (tables, columns, constraints,
    indexes, enums, domains, functions, triggers), leaving out ``schema_migrations``."""
    out: dict[str, list[str]] = {}
    for key, sql in _DESCRIBE.items():
        out[key] = sorted(r[0] for r in await conn.fetch(sql))
    return out
