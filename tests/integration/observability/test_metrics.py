"""Metrics (docs/metrics.md) and structured logs (issue 3): ``/metrics`` of the API and of real
service processes, counters and histograms moved by real jobs through the simulator, the
deletion guard's counter, the LISTEN health gauge, the index-only job counts, and JSON log lines
carrying the job's fields."""
from __future__ import annotations

import asyncio
import io
import json
import logging
import re
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from typing import Any, AsyncIterator, Iterator

import aiohttp
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from z9.common import metrics, store
from z9.common.clock import TestClock
from z9.common.logs import bind_job, make_handler
from z9.common.settings import Settings
from z9.executor import proxmox
from z9.scheduler import Scheduler

from tests.support import REGION, SimAdmin, Stack, free_port, service_env, wait_until

Samples = dict[tuple[str, frozenset], float]


def parse(text: str) -> Samples:
    """``{(sample name, frozenset(labels)): value}`` of a text exposition."""
    return {(s.name, frozenset(s.labels.items())): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def local(*names: str) -> Samples:
    """This process's registry (what its /metrics serves); with ``names``, only those samples.
    Loops that poll use ``names``: the whole exposition, rendered and parsed, takes 0.3 s of CPU
    here (2 s on a loaded machine) on the event loop the services under test share — polled every
    few ms, it starved them (the executor's LISTEN connection did not come up in 10 s)."""
    if names:
        return parse(generate_latest(REGISTRY.restricted_registry(names)).decode())
    return parse(metrics.exposition()[0].decode())


def val(samples: Samples, name: str, **labels: str) -> float:
    """The sample's value; KeyError when the series does not exist (not pre-initialised)."""
    return samples[(name, frozenset(labels.items()))]


def delta(after: Samples, before: Samples, name: str, **labels: str) -> float:
    return val(after, name, **labels) - before.get((name, frozenset(labels.items())), 0.0)


async def _job_status_is(stack: Stack, job_id: str, status: str) -> bool:
    return (await stack.job(job_id))["status"] == status


async def _server_status_is(stack: Stack, server_id: str, status: str) -> bool:
    return (await stack.server(server_id))["status"] == status


async def settled(name: str, before: Samples, timeout_s: float = 10, **labels: str) -> Samples:
    """This process's samples once ``name{labels}`` has moved since ``before`` (the runner counts
    an attempt right after the write that ends it, so an API reader may see the job first)."""
    await wait_until(lambda: delta(local(name), before, name, **labels) != 0, timeout_s, f"{name}{labels} to move",
                     interval_s=0.02)
    return local()


async def scrape(url: str) -> Samples:
    async with aiohttp.ClientSession() as http:
        async with http.get(url) as r:
            assert r.status == 200, await r.text()
            assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            return parse(await r.text())


def metrics_url(stack: Stack) -> str:
    return stack.metrics_url


@pytest.fixture
def json_logs() -> Iterator[io.StringIO]:
    """JSON log lines of every ``z9.*`` logger (DEBUG and up) during the test."""
    out = io.StringIO()
    handler = make_handler("test", "json", stream=out)
    logger = logging.getLogger("z9")
    old = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)  # the per-job success line is DEBUG
    try:
        yield out
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old)


def log_lines(out: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.getvalue().splitlines() if line.strip()]


# ---------------------------------------------------------------------------------- API

async def test_api_metrics_by_route_template_without_auth(api: Stack) -> None:
    before = await scrape(metrics_url(api))
    # pre-initialised: every route has its series before any request
    assert val(before, "z9_http_requests_total", method="DELETE", route="/v1/servers/{id}", status="500") == 0
    assert ("z9_http_request_duration_seconds_count",
            frozenset({"method": "POST", "route": "/v1/servers/{id}/actions/cancel-deletion"}.items())) in before

    server, _ = await api.create_server("m-1")
    await api.server(server["id"])
    status, _ = await api.call("GET", "/servers/srv_00000000000000000000000000")  # a 404 from the handler
    assert status == 404
    async with api.http.get(api.base.removesuffix("/v1") + "/no/such/path") as r:
        assert r.status == 404
    status, _ = await api.call("GET", "/servers", token="z9t_wrong")
    assert status == 401
    for verb in ("PROPFIND", "MKCALENDAR", "LOCK"):  # not z9's methods: one `other` label value
        async with api.http.request(verb, api.base.removesuffix("/v1") + "/healthz") as r:
            assert r.status == 405

    after = await scrape(metrics_url(api))
    assert delta(after, before, "z9_http_requests_total", method="POST", route="/v1/servers", status="202") == 1
    assert delta(after, before, "z9_http_requests_total", method="GET", route="/v1/servers/{id}", status="200") == 1
    assert delta(after, before, "z9_http_requests_total", method="GET", route="/v1/servers/{id}", status="404") == 1
    assert delta(after, before, "z9_http_requests_total", method="GET", route="unmatched", status="404") == 1
    assert delta(after, before, "z9_http_requests_total", method="GET", route="/v1/servers", status="401") == 1
    assert delta(after, before, "z9_http_request_duration_seconds_count", method="GET", route="/v1/servers/{id}") == 2
    assert delta(after, before, "z9_http_request_duration_seconds_sum", method="POST", route="/v1/servers") > 0
    # the first scrape itself was counted, by its own route
    assert delta(after, before, "z9_http_requests_total", method="GET", route="/metrics", status="200") == 1
    assert not any("srv_" in str(labels) for _, labels in after)  # never an id in a label
    assert delta(after, before, "z9_http_requests_total", method="other", route="unmatched", status="405") == 3
    assert not any(dict(labels).get("method") in ("PROPFIND", "MKCALENDAR", "LOCK") for _, labels in after)


# ---------------------------------------------------------------------------------- executor, in process

async def test_a_create_job_moves_the_executor_metrics(stack: Stack, sim: SimAdmin, json_logs: io.StringIO) -> None:
    before = local()
    for kind in ("ServerCreate", "ServerStop", "ServerStart", "ServerDelete"):  # pre-initialised
        for outcome, error_class in metrics.ATTEMPT_ENDINGS:
            assert ("z9_job_attempts_total", frozenset(
                {"kind": kind, "region": REGION, "outcome": outcome, "error_class": error_class}.items())) in before
    server, job = await stack.create_server("m-2")
    done = await stack.wait_job(job["id"])
    assert done["status"] == "succeeded", done
    await settled("z9_job_attempts_total", before, kind="ServerCreate", region=REGION, outcome="succeeded",
                  error_class="none")
    after = await scrape(metrics_url(stack))

    create = {"kind": "ServerCreate", "region": REGION}
    assert delta(after, before, "z9_job_attempts_total", **create, outcome="succeeded", error_class="none") == 1
    assert delta(after, before, "z9_job_attempts_total", **create, outcome="retry", error_class="temporary") == 0
    assert delta(after, before, "z9_job_duration_seconds_count", **create, outcome="succeeded") == 1
    assert delta(after, before, "z9_job_duration_seconds_sum", **create, outcome="succeeded") > 0
    for phase in metrics.PHASES:
        assert delta(after, before, "z9_job_phase_duration_seconds_count", **create, phase=phase) == 1, phase
    assert delta(after, before, "z9_job_queue_wait_seconds_count", **create) == 1
    assert val(after, "z9_executor_jobs_in_flight", region=REGION) == 0
    assert val(after, "z9_executor_listen_healthy") == 1

    clone = {"region": REGION, "method": "POST", "endpoint": "/nodes/{node}/qemu/{vmid}/clone"}
    assert delta(after, before, "z9_proxmox_requests_total", **clone, status="200") == 1
    assert delta(after, before, "z9_proxmox_request_duration_seconds_count", **clone) == 1
    # observe and verify both look the VM up in the process's shared snapshot (issue 13 §4): every
    # listing sent is counted once as 'listed', the lookups it spared as 'shared'
    listed = delta(after, before, "z9_proxmox_requests_total", region=REGION, method="GET",
                   endpoint="/cluster/resources", status="200")
    assert listed >= 1
    assert delta(after, before, "z9_proxmox_snapshot_lookups_total", region=REGION, outcome="listed") == listed
    assert listed + delta(after, before, "z9_proxmox_snapshot_lookups_total", region=REGION, outcome="shared") >= 3
    # the config write is synchronous (PUT): no qmconfig task
    for task_type in ("qmclone", "resize", "qmstart"):
        assert delta(after, before, "z9_proxmox_task_wait_seconds_count", region=REGION, task_type=task_type,
                     outcome="ok") == 1, task_type
    assert delta(after, before, "z9_proxmox_task_wait_seconds_count", region=REGION, task_type="qmclone",
                 outcome="failed") == 0

    # every log line about the job carries its fields, whichever module logged it
    lines = [line for line in log_lines(json_logs) if job["id"] in line["msg"] or line.get("job_id") == job["id"]]
    assert any("succeeded" in line["msg"] for line in lines), lines
    for line in lines:
        assert (line["job_id"], line["kind"], line["region"], line["attempt"]) == (job["id"], "ServerCreate", REGION, 1), line


async def test_scheduler_counts_jobs_and_the_oldest_pending_age(stack: Stack, sim: SimAdmin, clock: TestClock) -> None:
    scheduler: Scheduler = stack.services["scheduler"]
    server, job = await stack.create_server("m-3")
    assert (await stack.wait_job(job["id"]))["status"] == "succeeded"
    await stack.stop_service("executor")
    _, waiting = await stack.create_server("m-4")
    clock.step(0.3)  # the pending job is 0.3 s old
    await scheduler.refresh_job_metrics()
    s = local()
    assert val(s, "z9_jobs", kind="ServerCreate", region=REGION, status="succeeded") == 1
    assert val(s, "z9_jobs", kind="ServerCreate", region=REGION, status="pending") == 1
    assert val(s, "z9_jobs", kind="ServerDelete", region=REGION, status="running") == 0  # pre-initialised
    age = val(s, "z9_job_oldest_pending_age_seconds", region=REGION)
    assert 0.3 <= age < 30, age

    await stack.start_service("executor")
    assert (await stack.wait_job(waiting["id"]))["status"] == "succeeded"
    await scheduler.refresh_job_metrics()
    s = local()
    assert val(s, "z9_jobs", kind="ServerCreate", region=REGION, status="succeeded") == 2
    assert val(s, "z9_jobs", kind="ServerCreate", region=REGION, status="pending") == 0
    assert val(s, "z9_job_oldest_pending_age_seconds", region=REGION) == 0


async def test_oldest_pending_age_of_a_region_gone_from_the_table_reads_0(stack: Stack) -> None:
    """A region seen with pending jobs but neither configured nor pending any more (its jobs
    finished, or it was removed from Z9_REGIONS) must not keep its last age: Z9QueueStalled
    would keep firing."""
    scheduler: Scheduler = stack.services["scheduler"]
    await wait_until(lambda: scheduler.pool is not None, 10, "the scheduler's pool (made by its run loop)")
    await stack.pool.execute(
        "INSERT INTO jobs (id, kind, region, resource_type, resource_id, status, attempt, created_at, run_after) "
        "VALUES ($1, 'ServerCreate', 'gone-1', 'server', $2, 'pending', 0, now() - interval '400 seconds', "
        "now() - interval '400 seconds')", "job_" + "g" * 26, "srv_" + "g" * 26)
    async def aged() -> float:  # (the stack's scheduler loop may set an older reading after ours)
        await scheduler.refresh_job_metrics()
        age = val(local("z9_job_oldest_pending_age_seconds"), "z9_job_oldest_pending_age_seconds", region="gone-1")
        return age if age >= 400 else 0.0
    age = await wait_until(aged, 10, "gone-1's oldest pending age", interval_s=0.1)
    assert 400 <= age < 460
    await stack.pool.execute("UPDATE jobs SET status = 'failed', finished_at = now(), "
                             "error = '{\"class\": \"permanent\", \"message\": \"test\"}' WHERE id = $1",
                             "job_" + "g" * 26)
    # The stack's own scheduler loop refreshes too: a pass that read the table before the UPDATE
    # may set its figures after ours, so wait for the next passes rather than one.
    async def settled_() -> Samples | None:
        await scheduler.refresh_job_metrics()
        s = local("z9_job_oldest_pending_age_seconds", "z9_jobs")
        done = (val(s, "z9_job_oldest_pending_age_seconds", region="gone-1") == 0
                and val(s, "z9_jobs", kind="ServerCreate", region="gone-1", status="pending") == 0
                and val(s, "z9_jobs", kind="ServerCreate", region="gone-1", status="failed") == 1)
        return s if done else None
    s = await wait_until(settled_, 10, "gone-1's figures settled", interval_s=0.1)
    assert val(s, "z9_job_oldest_pending_age_seconds", region="gone-1") == 0
    assert val(s, "z9_jobs", kind="ServerCreate", region="gone-1", status="pending") == 0
    assert val(s, "z9_jobs", kind="ServerCreate", region="gone-1", status="failed") == 1


async def test_lease_reclaim_and_promotion_are_counted(stack: Stack, sim: SimAdmin) -> None:
    await stack.stop_service("executor")
    _, job = await stack.create_server("m-5")
    # a worker that died holding the lease
    await stack.pool.execute("UPDATE jobs SET status = 'running', attempt = 1, lease_owner = 'dead', "
                             "lease_expires_at = now() - interval '1 second' WHERE id = $1", job["id"])
    before = local()
    await wait_until(lambda: _job_status_is(stack, job["id"], "pending"), 20, "the reclaimed job pending")
    after = local()
    assert delta(after, before, "z9_lease_reclaims_total", kind="ServerCreate", region=REGION) == 1
    assert delta(after, before, "z9_job_promotions_total", region=REGION) == 1
    assert delta(after, before, "z9_job_attempts_total", kind="ServerCreate", region=REGION,
                 outcome="failed", error_class="attempts_exhausted") == 0


async def test_a_job_failed_at_lease_reclaim_counts_as_a_failed_attempt(stack: Stack, sim: SimAdmin) -> None:
    """Out of attempts when its lease expires: the scheduler fails it, and counts it where the
    failure alerts look (no executor is there to count it)."""
    await stack.stop_service("executor")
    _, job = await stack.create_server("m-6")
    await stack.pool.execute("UPDATE jobs SET status = 'running', attempt = max_attempts, lease_owner = 'dead', "
                             "lease_expires_at = now() - interval '1 second' WHERE id = $1", job["id"])
    before = local()
    await wait_until(lambda: _job_status_is(stack, job["id"], "failed"), 20, "the reclaimed job failed")
    after = local()
    assert delta(after, before, "z9_lease_reclaims_total", kind="ServerCreate", region=REGION) == 1
    assert delta(after, before, "z9_job_attempts_total", kind="ServerCreate", region=REGION,
                 outcome="failed", error_class="attempts_exhausted") == 1


# 6 (issue 2): the deletion guard, now counted
@pytest.mark.settings(deletion_buffer_s=1.0)
async def test_a_guard_refusal_is_counted_and_logged_with_the_job(stack: Stack, sim: SimAdmin,
                                                                  json_logs: io.StringIO) -> None:
    await stack.stop_service("executor")
    server, job = await stack.create_server("ghost")
    await stack.pool.execute("UPDATE jobs SET status = 'failed', finished_at = now(), "
                             "error = '{\"class\": \"permanent\", \"message\": \"test\"}' WHERE id = $1", job["id"])
    await stack.pool.execute("UPDATE servers SET vmid = 100, node = 'pve1', power_state = 'running', "
                             "status = 'running' WHERE id = $1", server["id"])
    await stack.start_service("executor")
    before = local()
    status, out = await stack.call("DELETE", f"/servers/{server['id']}")
    assert status == 202
    stop = await stack.wait_job(out["job"]["id"])
    assert stop["status"] == "failed" and "z9-role-agent" in stop["error"]["message"], stop
    after = await settled("z9_job_attempts_total", before, kind="ServerStop", region=REGION, outcome="failed",
                          error_class="guard")
    assert delta(after, before, "z9_deletion_guard_refusals_total", kind="ServerStop", region=REGION) == 1
    assert delta(after, before, "z9_job_attempts_total", kind="ServerStop", region=REGION, outcome="failed",
                 error_class="guard") == 1
    assert delta(after, before, "z9_deletion_guard_refusals_total", kind="ServerDelete", region=REGION) == 0

    # the guard's own error line (logged deep in the job kind, without extra=) carries the job
    guard_lines = [line for line in log_lines(json_logs)
                   if line["level"] == "ERROR" and "z9-role-agent" in line["msg"] and line["logger"] != "z9.executor"]
    assert guard_lines, log_lines(json_logs)
    for line in guard_lines:
        assert (line["job_id"], line["kind"], line["region"], line["attempt"]) == (stop["id"], "ServerStop", REGION, 1)
        assert line["service"] == "test" and line["ts"].endswith("Z")


async def test_listen_health_gauge_and_reconnects(stack: Stack, sim: SimAdmin) -> None:
    executor = stack.services["executor"]

    async def gauge_becomes(value: float, timeout_s: float = 10) -> None:
        await wait_until(lambda: val(local("z9_executor_listen_healthy"), "z9_executor_listen_healthy") == value,
                         timeout_s, f"z9_executor_listen_healthy to become {value}", interval_s=0.01)

    await gauge_becomes(1)
    before = local()
    killed = await stack.pool.fetchval(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
        "WHERE application_name = 'z9-executor-listen' AND datname = current_database()")
    assert killed == 1
    await gauge_becomes(0)
    assert not executor.listen_healthy
    await gauge_becomes(1)
    assert delta(local(), before, "z9_executor_listen_reconnects_total") == 1
    # and the claim loop still works through the new connection
    _, job = await stack.create_server("m-6")
    assert (await stack.wait_job(job["id"]))["status"] == "succeeded"
    await stack.stop_service("executor")
    assert val(local(), "z9_executor_listen_healthy") == 0


# ---------------------------------------------------------------------------------- index-only counts

_FILL = """
INSERT INTO jobs (id, kind, region, resource_type, resource_id, status, attempt, lease_owner,
                  lease_expires_at, error, finished_at)
SELECT 'job_' || lpad(to_hex(i), 26, '0'), (ARRAY['ServerCreate', 'ServerStop'])[1 + i % 2],
       (ARRAY['dev-1', 'eu-1'])[1 + i % 2], 'server', 'srv_' || lpad(to_hex(i), 26, '0'), st, 1,
       CASE WHEN st = 'running' THEN 'x' END, CASE WHEN st = 'running' THEN now() + interval '1 hour' END,
       CASE WHEN st = 'failed' THEN '{"class": "permanent", "message": "x"}'::jsonb END,
       CASE WHEN st IN ('succeeded', 'failed') THEN now() END
FROM generate_series(1, $1) AS i,
     LATERAL (SELECT CASE WHEN i % 100 = 1 THEN 'pending' WHEN i % 100 = 2 THEN 'running'
                          WHEN i % 10 = 3 THEN 'failed' ELSE 'succeeded' END::job_status AS st) s
"""


async def test_job_metric_queries_are_index_only(pool: Any) -> None:
    await pool.execute(_FILL, 20000)
    await pool.execute("VACUUM ANALYZE jobs")
    from z9.common.sql import q

    for query, index in (("job_count_live", "jobs_resource_live"), ("job_count_finished", "jobs_finished")):
        plan = "\n".join(r[0] for r in await pool.fetch("EXPLAIN " + q(query)))
        assert f"Index Only Scan using {index}" in plan, plan
        assert "Seq Scan" not in plan and "Heap" not in plan, plan
    # no index but the primary key covers every row: each update of a job adds an entry to it
    # (jobs_resource and jobs_tenant leave out the jobs without a resource / tenant, migration 0012)
    partial = await pool.fetch("SELECT indexrelid::regclass::text AS name, indpred IS NOT NULL AS partial "
                               "FROM pg_index WHERE indrelid = 'jobs'::regclass")
    full = {r["name"] for r in partial if not r["partial"]}
    assert full == {"jobs_pkey"}, full
    plan = "\n".join(r[0] for r in await pool.fetch("EXPLAIN " + q("job_oldest_pending_age"), ["dev-1", "eu-1"], None))
    assert "Index Only Scan using jobs_pending_runnable" in plan, plan
    assert "Index Only Scan using jobs_resource_live" in plan, plan
    assert "Seq Scan" not in plan, plan

    counts = {(k, r, s): n for k, r, s, n in await store.job_count_by_status(pool, metrics.JOB_STATUSES)}
    assert sum(counts.values()) == 20000
    assert counts[("ServerStop", "eu-1", "pending")] == 200  # i % 100 == 1: odd i
    assert counts[("ServerCreate", "dev-1", "running")] == 200  # i % 100 == 2: even i
    assert ("ServerCreate", "dev-1", "pending") not in counts


async def test_oldest_pending_age_skips_jobs_waiting_behind_their_resource(pool: Any) -> None:
    old = "now() - interval '100 seconds'"
    rows = [  # (resource, status, age)
        ("srv_" + "a" * 26, "running", old), ("srv_" + "a" * 26, "pending", old),  # blocked: not runnable
        ("srv_" + "b" * 26, "pending", "now() - interval '7 seconds'"),
        ("srv_" + "c" * 26, "pending", "now() + interval '60 seconds'"),  # not due yet
    ]
    for i, (rid, status, at) in enumerate(rows):
        await pool.execute(
            f"INSERT INTO jobs (id, kind, region, resource_type, resource_id, status, attempt, lease_owner, "
            f"lease_expires_at, created_at, run_after) VALUES ($1, 'ServerCreate', 'dev-1', 'server', $2, $3, 1, "
            f"$4, $5, least({at}, now()), {at})",
            f"job_{i:026d}", rid, status, "x" if status == "running" else None,
            datetime.now().astimezone() if status == "running" else None)
    ages = await store.job_oldest_pending_age(pool, ["dev-1", "eu-1"])
    assert 7 <= ages["dev-1"] < 20, ages
    assert ages["eu-1"] == 0


# ---------------------------------------------------------------------------------- logs

def test_json_log_line_fields_trace_and_exception() -> None:
    out = io.StringIO()
    log = logging.getLogger("z9.test.logs")
    handler = make_handler("executor", "json", stream=out)
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    tracer = TracerProvider().get_tracer("test")
    try:
        log.info("no job here")
        with tracer.start_as_current_span("job") as span:
            log.info("job %s: step", "job_x", extra={"job_id": "job_x", "kind": "ServerCreate",
                                                    "region": "dev-1", "attempt": 2})
            try:
                raise ValueError("boom")
            except ValueError:
                log.exception("it failed")
        ctx = span.get_span_context()
    finally:
        log.removeHandler(handler)
        log.propagate = True
    plain, job_line, exc_line = log_lines(out)
    assert set(plain) == {"ts", "level", "service", "logger", "msg"}
    assert plain["service"] == "executor" and plain["logger"] == "z9.test.logs" and plain["level"] == "INFO"
    assert datetime.fromisoformat(plain["ts"].replace("Z", "+00:00")).utcoffset().total_seconds() == 0
    assert job_line["msg"] == "job job_x: step"
    assert (job_line["job_id"], job_line["kind"], job_line["region"], job_line["attempt"]) == (
        "job_x", "ServerCreate", "dev-1", 2)
    assert job_line["trace_id"] == trace.format_trace_id(ctx.trace_id) and len(job_line["trace_id"]) == 32
    assert job_line["span_id"] == trace.format_span_id(ctx.span_id)
    assert exc_line["level"] == "ERROR" and "ValueError: boom" in exc_line["exc"] and "Traceback" in exc_line["exc"]


async def test_bound_job_fields_stay_in_their_task() -> None:
    out = io.StringIO()
    log = logging.getLogger("z9.test.bound")
    log.addHandler(make_handler("executor", "text", stream=out))
    log.setLevel(logging.INFO)
    log.propagate = False

    class J:
        def __init__(self, i: int):
            self.id, self.kind, self.region, self.attempt = f"job_{i}", "ServerStop", "dev-1", i

    async def run(i: int) -> None:
        bind_job(J(i))
        await asyncio.sleep(0.01 * (3 - i))
        log.info("inside %d", i)

    await asyncio.gather(run(1), run(2))
    log.info("outside")
    log.handlers.clear()
    log.propagate = True
    lines = out.getvalue().splitlines()
    assert any(line.endswith("inside 1 [job_id=job_1 kind=ServerStop region=dev-1 attempt=1]") for line in lines), lines
    assert any(line.endswith("inside 2 [job_id=job_2 kind=ServerStop region=dev-1 attempt=2]") for line in lines), lines
    assert [line for line in lines if "outside" in line][0].endswith("outside")


# ---------------------------------------------------------------------------------- real processes

def _env(settings: Settings, port: int) -> dict[str, str]:
    return service_env(settings, metrics_port=port, log_format="json",
                       log_level="DEBUG",  # the per-job success line is DEBUG
                       task_poll_s=0.05, scheduler_interval_s=0.1, job_metrics_interval_s=0.2,
                       job_metrics_finished_interval_s=0.2)


async def _scrape_when_up(url: str, proc: subprocess.Popen, timeout_s: float = 30) -> Samples:
    async def up() -> Samples | None:
        assert proc.poll() is None, f"{proc.args} exited with {proc.returncode}"
        try:
            return await scrape(url)
        except aiohttp.ClientConnectionError:
            return None
    return await wait_until(up, timeout_s, f"{url} to answer", interval_s=0.1)


@pytest.fixture
async def processes(settings: Settings, sim: SimAdmin) -> AsyncIterator[dict[str, tuple[subprocess.Popen, str]]]:
    """``z9 scheduler``, ``z9 executor``, ``z9 reaper`` as processes, each serving /metrics."""
    procs: dict[str, tuple[subprocess.Popen, str]] = {}
    try:
        for name in ("scheduler", "executor", "reaper"):
            port = free_port()
            proc = subprocess.Popen([sys.executable, "-m", "z9", name], env=_env(settings, port),
                                    stdout=subprocess.DEVNULL, text=True,  # the executor's log is read
                                    stderr=subprocess.PIPE if name == "executor" else subprocess.DEVNULL)
            procs[name] = (proc, f"http://127.0.0.1:{port}/metrics")
        yield procs
    finally:
        for proc, _ in procs.values():
            proc.terminate()
        for proc, _ in procs.values():
            proc.wait(timeout=30)


async def test_service_processes_serve_metrics_and_json_logs(api: Stack, processes: dict) -> None:
    (scheduler, s_url), (executor, e_url), (reaper, r_url) = (processes[n] for n in ("scheduler", "executor", "reaper"))
    quiet = await _scrape_when_up(s_url, scheduler)
    # a quiet stack: every series an alert or dashboard asks for exists, at 0
    for kind in ("ServerCreate", "ServerStop", "ServerStart", "ServerDelete"):
        for status in metrics.JOB_STATUSES:
            assert val(quiet, "z9_jobs", kind=kind, region=REGION, status=status) == 0
        assert val(quiet, "z9_lease_reclaims_total", kind=kind, region=REGION) == 0
    assert val(quiet, "z9_job_oldest_pending_age_seconds", region=REGION) == 0
    assert val(quiet, "z9_jobs_pruned_total") == 0
    assert "process_cpu_seconds_total" in {name for name, _ in quiet}
    r = await _scrape_when_up(r_url, reaper)
    assert val(r, "z9_deletion_buffer_expiries_total", region=REGION) == 0
    e = await _scrape_when_up(e_url, executor)
    assert val(e, "z9_proxmox_requests_total", region=REGION, method="POST",
               endpoint="/nodes/{node}/qemu/{vmid}/clone", status="error") == 0
    assert val(e, "z9_deletion_guard_refusals_total", kind="ServerDelete", region=REGION) == 0
    async def listening() -> bool:
        return val(await scrape(e_url), "z9_executor_listen_healthy") == 1
    await wait_until(listening, 30, "the executor's LISTEN healthy", interval_s=0.1)

    _, job = await api.create_server("proc-1")
    assert (await api.wait_job(job["id"]))["status"] == "succeeded"
    async def counted(url: str, name: str, **labels: str) -> Samples | None:
        got = await scrape(url)
        return got if val(got, name, **labels) == 1 else None
    # the attempt is counted right after the write the API shows
    e = await wait_until(lambda: counted(e_url, "z9_job_attempts_total", kind="ServerCreate", region=REGION,
                                         outcome="succeeded", error_class="none"), 10, "the executor to count the attempt")
    assert val(e, "z9_job_queue_wait_seconds_count", kind="ServerCreate", region=REGION) == 1
    s = await wait_until(lambda: counted(s_url, "z9_jobs", kind="ServerCreate", region=REGION, status="succeeded"),
                         10, "the scheduler to count the finished job", interval_s=0.2)
    assert not any("z9_http" in name for name, _ in s)  # each process serves its own metrics
    for other in (s, r):  # only executors export the LISTEN health
        assert not any(name.startswith("z9_executor_listen") for name, _ in other)
    for other in (e, r):  # only schedulers count pruned jobs
        assert not any(name.startswith("z9_jobs_pruned") for name, _ in other)

    executor.terminate()
    _, err = executor.communicate(timeout=30)
    lines = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    assert len(lines) == len([line for line in err.splitlines() if line.strip()]), err  # JSON only
    about = [line for line in lines if job["id"] in line["msg"]]
    assert about and all(line.get("job_id") == job["id"] and line["kind"] == "ServerCreate"
                         and line["region"] == REGION and line["attempt"] == 1 for line in about), about
    assert all(line["service"] == "executor" for line in lines)


async def test_a_taken_metrics_port_stops_the_service(settings: Settings) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        proc = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "z9", "reaper"],
                                       env=_env(settings, port), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "cannot serve metrics" in proc.stderr and "Z9_METRICS_PORT" in proc.stderr


# ---------------------------------------------------------------------------------- the adapter's endpoints

def test_every_proxmox_endpoint_has_pre_created_series() -> None:
    source = Path(proxmox.__file__).read_text()
    used = set(re.findall(r'"((?:GET|POST|PUT|DELETE) /[^"]*)"', source))
    assert used and used == set(proxmox.ENDPOINTS)


def test_every_endpoint_a_slice_calls_is_declared() -> None:
    # a slice's own Proxmox adapter (resources/z9/resources/<type>/pve.py) calls through
    # ProxmoxClient.call: what it calls is the client's or its type's declared pve_endpoints
    from z9 import resources
    declared = set(proxmox.ENDPOINTS) | set(resources.pve_endpoints())
    adapters = [Path(resources.__file__).parent / rt.name / "pve.py" for rt in resources.types()]
    adapters = [p for p in adapters if p.exists()]
    assert adapters
    for p in adapters:
        used = set(re.findall(r'"((?:GET|POST|PUT|DELETE) /[^"]*)"', p.read_text()))
        assert used and used <= declared, (p, used - declared)


# ---------------------------------------------------------------------------------- outcomes

async def test_retries_task_failures_and_proxmox_statuses_are_counted(stack: Stack, sim: SimAdmin) -> None:
    # a 500 that is an answer about the clone (not "not performed": the call is not tried again
    # within the step) ends attempt 1; the failed start task ends attempt 2, which got steps done
    # and is given back (counted as a retry all the same): the job succeeds on attempt 2
    await sim.fault(method="POST", path=r"/clone$", action="error", status=500,
                    reason="simulated busy node", times=1)
    await sim.fault(method="POST", path=r"/status/start$", action="fail_task",
                    exitstatus="start failed: QEMU exited with code 1", times=1)
    before = local()
    _, job = await stack.create_server("m-7")
    done = await stack.wait_job(job["id"])
    assert done["status"] == "succeeded" and done["attempt"] == 2, done
    after = await settled("z9_job_attempts_total", before, kind="ServerCreate", region=REGION,
                          outcome="succeeded", error_class="none")
    create = {"kind": "ServerCreate", "region": REGION}
    assert delta(after, before, "z9_job_attempts_total", **create, outcome="retry", error_class="temporary") == 2
    assert delta(after, before, "z9_job_duration_seconds_count", **create, outcome="retry") == 2
    clone = {"region": REGION, "method": "POST", "endpoint": "/nodes/{node}/qemu/{vmid}/clone"}
    assert delta(after, before, "z9_proxmox_requests_total", **clone, status="500") == 1
    assert delta(after, before, "z9_proxmox_requests_total", **clone, status="200") == 1
    assert delta(after, before, "z9_proxmox_task_wait_seconds_count", region=REGION, task_type="qmstart",
                 outcome="failed") == 1
    assert delta(after, before, "z9_proxmox_task_wait_seconds_count", region=REGION, task_type="qmstart",
                 outcome="ok") == 1


async def test_a_dropped_answer_counts_as_error(stack: Stack, sim: SimAdmin) -> None:
    await sim.fault(method="POST", path=r"/clone$", action="drop", times=1)
    before = local()
    _, job = await stack.create_server("m-8")
    assert (await stack.wait_job(job["id"]))["status"] == "succeeded"
    after = local()
    assert delta(after, before, "z9_proxmox_requests_total", region=REGION, method="POST",
                 endpoint="/nodes/{node}/qemu/{vmid}/clone", status="error") == 1


@pytest.mark.settings(shutdown_grace_s=0.2)
async def test_shutdown_hands_over_and_counts_it(stack: Stack, sim: SimAdmin) -> None:
    await sim.configure(task_seconds={"qmclone": 5.0})
    before = local()
    _, job = await stack.create_server("m-9")

    async def cloning() -> bool:
        steps = (await stack.job(job["id"]))["steps"]
        return bool(steps and steps[0]["state"] == "running" and steps[0]["detail"].get("upid"))
    await wait_until(cloning, 20, "the clone running")
    assert val(local(), "z9_executor_jobs_in_flight", region=REGION) == 1
    await stack.stop_service("executor")
    after = local()
    assert delta(after, before, "z9_job_attempts_total", kind="ServerCreate", region=REGION,
                 outcome="handed_over", error_class="none") == 1
    assert val(after, "z9_executor_jobs_in_flight", region=REGION) == 0
    assert (await stack.job(job["id"]))["status"] in ("retry", "pending")


@pytest.mark.settings(deletion_buffer_s=0.3)
async def test_an_expired_deletion_buffer_is_counted(stack: Stack, sim: SimAdmin) -> None:
    server, job = await stack.create_server("m-10")
    assert (await stack.wait_job(job["id"]))["status"] == "succeeded"
    before = local()
    status, out = await stack.call("DELETE", f"/servers/{server['id']}")
    assert status == 202
    await wait_until(lambda: _server_status_is(stack, server["id"], "deleted"), 30, "the server deleted")
    after = local()
    assert delta(after, before, "z9_deletion_buffer_expiries_total", region=REGION) == 1
    assert delta(after, before, "z9_job_attempts_total", kind="ServerDelete", region=REGION,
                 outcome="succeeded", error_class="none") == 1
