"""What a textual merge can break silently, caught before a job meets it.

- Every named query in ``libs/common/z9/common/queries/*.sql`` and every slice's ``queries.sql`` is one statement PostgreSQL accepts against the
  migrated schema (``PREPARE``: parsed, planned, never run): two queries interleaved by a merge (a
  ``RETURNING`` of one left under another) fail here, not in the first job that uses them.
- No class or module defines a function twice: the second definition silently replaces the first
  (two branches each adding ``ProxmoxClient.agent_exec`` with different signatures).
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import asyncpg

import z9.api.app  # noqa: F401  (registers every resource type)
from z9 import resources
from z9.common.sql import NULL, ql, queries, qt


#: sample values of the queries whose values are literals (sql.ql), by placeholder
LITERAL_SAMPLES = {"limit": 1, "lease_ttl_s": 30.0, "now": NULL, "tenant_cap": 4}


async def test_every_named_query_prepares(pool: asyncpg.Pool) -> None:
    types = list(resources.REGISTRY.values())
    assert types
    bad = []
    async with pool.acquire() as conn:
        for name, text in queries().items():
            if "{table}" in text or "{status_type}" in text:
                texts = [(f"{name}[{rt.table}]", qt(name, rt.table, rt.status_type)) for rt in types]
            elif re.search(r"(?<!')\{[a-z_]+\}(?!')", text):  # values as literals (sql.ql): samples
                keys = set(re.findall(r"(?<!')\{([a-z_]+)\}(?!')", text))
                texts = [(name, ql(name, **{k: LITERAL_SAMPLES.get(k, "x") for k in keys}))]
            else:
                texts = [(name, text)]
            for label, sql in texts:
                try:
                    await conn.prepare(sql)
                except asyncpg.PostgresError as e:
                    bad.append(f"{label}: {type(e).__name__}: {e}")
    assert not bad, "\n".join(bad)


def test_no_function_is_defined_twice_in_one_scope() -> None:
    root = Path(__file__).resolve().parents[2]
    dirs = ("libs", "services", "simulator", "z9", "db", "bench", "tests")
    twice = []
    for d in dirs:
        for f in sorted((root / d).rglob("*.py")):
            tree = ast.parse(f.read_text(), str(f))
            for scope in [tree, *(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef))]:
                seen: set[str] = set()
                for n in scope.body:
                    if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                        decorated = any(isinstance(x, ast.Attribute) and x.attr in ("setter", "deleter", "register")
                                        or isinstance(x, ast.Name) and x.id == "overload" for x in n.decorator_list)
                        if n.name in seen and not decorated:
                            twice.append(f"{f.relative_to(root)}:{n.lineno} {getattr(scope, 'name', '<module>')}.{n.name}")
                        seen.add(n.name)
    assert not twice, twice
