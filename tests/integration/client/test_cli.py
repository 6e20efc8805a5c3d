"""``z9 migrate`` and ``z9 token`` as an operator runs them (issue 13 §5): one clear line, no
traceback, when the database is unreachable, missing or refuses the login, or a name is invalid;
``z9 migrate --wait`` (the Kubernetes init containers) waits for another migrate."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import asyncpg

from tests.support import free_port, with_database


def _z9(*args: str, url: str | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("Z9_")}
    if url:
        env["Z9_DATABASE_URL"] = url
    return subprocess.run([sys.executable, "-m", "z9", *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


def _one_line(out: subprocess.CompletedProcess, code: int, *words: str) -> None:
    assert out.returncode == code, out
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    for w in words:
        assert w in lines[0], (w, lines[0])


def test_unreachable_missing_or_refused_database_is_one_line(pg_url: str) -> None:
    port = free_port()  # nothing listens there
    for cmd in (["migrate"], ["token", "--tenant", "acme"]):
        _one_line(_z9(*cmd, url=f"postgresql://postgres@127.0.0.1:{port}/z9"), 1,
                  f"z9 {cmd[0]}: cannot reach the database", "ConnectionRefusedError")
        _one_line(_z9(*cmd, url=f"postgresql://postgres@no-such-host.invalid:{port}/z9"), 1, "cannot reach the database")
    _one_line(_z9("migrate", url=with_database(pg_url, "z9_test_no_such_db")), 1, "the database does not exist",
              "z9_test_no_such_db")
    if "postgres@" in pg_url:  # a missing role is refused
        _one_line(_z9("token", "--tenant", "acme", url=pg_url.replace("postgres@", "z9_no_such_role@", 1)),
                  1, "refused the login")
    _one_line(_z9("migrate"), 1, "Z9_DATABASE_URL is not set")  # the hint, as before


def test_invalid_names_are_one_line_before_any_connection() -> None:
    port = free_port()
    url = f"postgresql://postgres@127.0.0.1:{port}/z9"
    for bad in ("Bad Name", "-leading-dash", "x" * 64, ""):
        _one_line(_z9("token", f"--tenant={bad}", url=url), 2, "invalid tenant name")
    _one_line(_z9("token", "--tenant", "ok", "--name", "   ", url=url), 2, "invalid token name")


async def test_migrate_wait_returns_once_another_migrate_applied_everything(pg_url: str) -> None:
    import secrets

    name = f"z9_test_{secrets.token_hex(6)}"
    admin = await asyncpg.connect(pg_url)
    await admin.execute(f'CREATE DATABASE "{name}"')
    url = with_database(pg_url, name)
    try:
        out = _z9("migrate", "--wait", "1", url=url)
        _one_line(out, 1, "still not applied after 1s")
        env = {k: v for k, v in os.environ.items() if not k.startswith("Z9_")}
        waiter = subprocess.Popen([sys.executable, "-m", "z9", "migrate", "--wait", "60"],
                                  env={**env, "Z9_DATABASE_URL": url}, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        time.sleep(1.0)
        assert waiter.poll() is None  # still waiting
        assert _z9("migrate", url=url).returncode == 0
        out, err = waiter.communicate(timeout=30)
        assert waiter.returncode == 0 and out.strip() == "schema is up to date", (out, err)
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()
