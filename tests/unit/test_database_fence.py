"""Fence by timeline (z9.common.dbfence), its pure parts: the host list of a connection string, one
host's string, and the judge of (system, timeline) per string."""
from __future__ import annotations

import pytest

from z9.common.dbfence import Fence, ServerIdentity, StaleServerError, hosts_of, with_host


def test_the_hosts_of_a_string_and_one_hosts_string() -> None:
    dsn = "postgresql://z9:s3cr@t@db1:5432,db2:5433/z9?target_session_attrs=read-write&sslmode=require"
    assert hosts_of(dsn) == ["db1:5432", "db2:5433"]
    assert with_host(dsn, "db2:5433") == "postgresql://z9:s3cr@t@db2:5433/z9?sslmode=require"
    assert hosts_of("postgresql://postgres@127.0.0.1:5432/postgres") == ["127.0.0.1:5432"]


def test_the_newest_timeline_is_remembered_and_an_older_one_or_another_system_refused() -> None:
    fence, key = Fence(), ("db1:5432", "db2:5432")
    fence.judge(key, ServerIdentity(7, 1), "db1:5432")
    fence.judge(key, ServerIdentity(7, 2), "db2:5432")  # a failover: newer, remembered
    assert fence.newest[key] == ServerIdentity(7, 2)
    with pytest.raises(StaleServerError, match="older than timeline 2") as e:
        fence.judge(key, ServerIdentity(7, 1), "db1:5432")
    assert e.value.reason == "older_timeline"
    with pytest.raises(StaleServerError, match="another database system") as e:
        fence.judge(key, ServerIdentity(8, 3), "db3:5432")
    assert e.value.reason == "other_system"
    fence.judge(("other:5432",), ServerIdentity(8, 1), "other:5432")  # another string: its own memory
    assert fence.newest[key] == ServerIdentity(7, 2)
