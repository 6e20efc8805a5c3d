"""The checks a service makes on its connections, made by the tools and behind a pooler too
(n13user's findings): ``z9 migrate``/``z9 token`` refuse a server that commits without a synchronous
standby when ``Z9_DATABASE_REQUIRE_SYNC_REPLICATION`` is set (one line, exit 2, nothing written);
a pooled connection whose bounded waits the pooler dropped is reported once, naming the fix.
"""
from __future__ import annotations

import logging
import os
import subprocess
import sys

import asyncpg
import pytest

from z9.common import db as z9db


def _z9(*args: str, url: str, **extra: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("Z9_")}
    env.update(Z9_DATABASE_URL=url, **extra)
    return subprocess.run([sys.executable, "-m", "z9", *args], env=env, capture_output=True, text=True, timeout=60)


async def test_tools_refuse_an_asynchronous_server_when_sync_replication_is_required(db_url: str) -> None:
    conn = await asyncpg.connect(db_url)
    try:
        before = await conn.fetchval("SELECT count(*) FROM api_tokens")
    finally:
        await conn.close()
    for cmd in (["migrate"], ["token", "--tenant", "syncless"]):
        out = _z9(*cmd, url=db_url, Z9_DATABASE_REQUIRE_SYNC_REPLICATION="true")
        assert out.returncode == 2, out
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
        assert f"z9 {cmd[0]}:" in lines[0] and "Z9_DATABASE_REQUIRE_SYNC_REPLICATION" in lines[0], lines
        assert "synchronous_standby_names" in lines[0]
    conn = await asyncpg.connect(db_url)
    try:
        assert await conn.fetchval("SELECT count(*) FROM api_tokens") == before  # nothing written
    finally:
        await conn.close()
    ok = _z9("token", "--tenant", "synced", url=db_url)  # without the requirement: as before
    assert ok.returncode == 0 and ok.stdout.strip().startswith("z9t_"), ok


async def test_bounded_waits_a_pooler_dropped_are_reported_once(db_url: str, caplog: pytest.LogCaptureFixture,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(z9db, "_unbounded_warned", False)
    want = {"lock_timeout": "2000", "statement_timeout": "60000", "idle_in_transaction_session_timeout": "15000"}
    conn = await asyncpg.connect(db_url)  # no startup parameters: what a transaction pooler gives
    try:
        with caplog.at_level(logging.WARNING, logger="z9.db"):
            assert await z9db.warn_unbounded_waits(conn, want) == list(want)
            assert await z9db.warn_unbounded_waits(conn, want) == list(want)
        warned = [r for r in caplog.records if "cannot set them per connection" in r.getMessage()]
        assert len(warned) == 1 and "ALTER ROLE" in warned[0].getMessage()
        await conn.execute("SET lock_timeout = '2s'; SET statement_timeout = '60s'; "
                           "SET idle_in_transaction_session_timeout = '15s'")  # as ALTER ROLE … SET gives
        assert await z9db.warn_unbounded_waits(conn, want) == []
    finally:
        await conn.close()
