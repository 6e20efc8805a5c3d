"""operator trip-ups with a connection string z9 cannot use (issue 13 §5).

A port out of range or not a number, or a broken IPv6 bracket, in ``Z9_DATABASE_URL`` printed a
Python traceback from every command (``z9 migrate``, ``z9 token``, ``z9 api``…): asyncpg raises
``OverflowError``/``ValueError`` while connecting, which no command expects. And
``Z9_DATABASE_POOLER=transaction`` without ``Z9_DATABASE_DIRECT_URL`` sent every LISTEN connection
and ``z9 migrate`` (a session advisory lock) through the transaction pooler, which drops
notifications without an error. Both must be one clear line naming the setting, the password never
printed.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from z9.common.settings import Settings


def _z9(*args: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith("Z9_")}
    return subprocess.run([sys.executable, "-m", "z9", *args], env={**base, **env}, capture_output=True,
                          text=True, timeout=timeout)


BAD_URLS = {
    "postgresql://z9:S3cretPw@127.0.0.1:99999/z9": "port",
    "postgresql://z9:S3cretPw@127.0.0.1:abc/z9": "port",
    "postgresql://z9:S3cretPw@db1:5432,db2:70000/z9": "port",
    "postgresql://z9:S3cretPw@[::1/z9": "IPv6",
    "mysql://z9:S3cretPw@127.0.0.1/z9": "postgresql://",
}


@pytest.mark.parametrize("cmd", [["migrate"], ["token", "--tenant", "acme"], ["scheduler"]])
def test_an_unusable_database_url_is_one_line(cmd: list[str]) -> None:
    for url, word in BAD_URLS.items():
        for var in ("Z9_DATABASE_URL", "Z9_DATABASE_DIRECT_URL"):
            env = {"Z9_DATABASE_URL": "postgresql://z9@127.0.0.1:1/z9", var: url}
            out = _z9(*cmd, env=env)
            lines = out.stderr.strip().splitlines()
            assert out.returncode == 2, (url, out)
            assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
            assert var in lines[0] and word in lines[0], (var, word, lines[0])
            assert "S3cretPw" not in out.stderr + out.stdout


def test_good_urls_pass() -> None:
    for url in ("postgresql://z9:pw@db1:5432,db2:5432/z9?target_session_attrs=read-write",
                "postgresql://z9@[::1]:5432/z9", "postgres://z9@db/z9/db/z9", "postgresql:///z9?host=/run/postgresql",
                "postgresql://z9@%2Frun%2Fpostgresql/z9", "postgresql://db1,db2:6432/z9"):
        assert Settings(database_url=url).database_url == url


def test_a_transaction_pooler_needs_a_direct_url_for_listen_and_migrate() -> None:
    with pytest.raises(ValueError, match="Z9_DATABASE_DIRECT_URL"):
        Settings(database_url="postgresql://z9@pgbouncer:6432/z9", database_pooler="transaction")
    with pytest.raises(ValueError, match="Z9_DATABASE_DIRECT_URL"):  # the same string is no direct one
        Settings(database_url="postgresql://z9@pgbouncer:6432/z9", database_pooler="transaction",
                 database_direct_url="postgresql://z9@pgbouncer:6432/z9")
    Settings(database_url="postgresql://z9@pgbouncer:6432/z9", database_pooler="transaction",
             database_direct_url="postgresql://z9@db:5432/z9")
    Settings(database_url="postgresql://z9@pgbouncer:6432/z9", database_pooler="session")  # LISTEN works there
    out = _z9("migrate", env={"Z9_DATABASE_URL": "postgresql://z9:S3cretPw@pgbouncer:6432/z9",
                              "Z9_DATABASE_POOLER": "transaction"})
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1, out.stderr
    assert "Z9_DATABASE_DIRECT_URL" in lines[0] and "S3cretPw" not in out.stderr
