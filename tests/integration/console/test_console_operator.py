"""The console's operator view in a real browser, and the operator API under it: a job retrying in
one region (the simulator refuses its clones) shows with its error and attempts among every
tenant's jobs, and the operator cancels it. A token without the operator scope gets 403."""
from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.integration.console.console_support import (
    DevStack,
    browser,
    dev_stack,
    new_page,
    require_browser,
    sign_in,
)

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevStack]:
    require_browser()
    yield from dev_stack(tmp_path_factory.mktemp("console-operator"))


@pytest.fixture(scope="module")
def chromium(stack: DevStack) -> Iterator[Any]:
    yield from browser()


@pytest.fixture(scope="module")
def operator_token(stack: DevStack) -> str:
    return stack.token_for("platform", "read", "write", "operator")


def test_operator_routes_need_the_operator_scope(stack: DevStack) -> None:
    for method, path in (("GET", "operator/jobs"), ("GET", "operator/regions"), ("GET", "operator/guard-refusals")):
        status, out = stack.api(method, path)
        assert status == 403 and out["error"]["code"] == "insufficient_scope", (path, out)


def test_operator_sees_a_retrying_job_and_cancels_it(stack: DevStack, chromium: Any, operator_token: str) -> None:
    fault = stack.sim("POST", "/faults", {"method": "POST", "path": ".*/clone$", "action": "error", "status": 503,
                                          "reason": "Service Unavailable", "probability": 1.0})  # every time
    try:
        status, out = stack.api("POST", "servers", {"name": f"stuck-{time.time_ns() % 10**8}", "region": "dev-1",
                                                    "image": "debian-12", "cores": 1, "memory_mib": 1024,
                                                    "disk_gib": 10})
        assert status == 202, out
        job_id = out["job"]["id"]
        deadline = time.monotonic() + 300
        while True:
            code, job = stack.api("GET", f"jobs/{job_id}?wait_s=5")
            if code == 200 and job["status"] == "retry":
                break
            assert time.monotonic() < deadline, ("the job never retried", code, job)
        # the API: every tenant's jobs, the retrying one first; the region's live counts
        status, listed = stack.api("GET", "operator/jobs?region=dev-1", token=operator_token)
        assert status == 200 and listed["jobs"][0]["status"] in ("retry", "pending", "running")
        mine = next(j for j in listed["jobs"] if j["id"] == job_id)
        assert mine["tenant"].startswith("ten_") and mine["attempt"] >= 1
        status, regions = stack.api("GET", "operator/regions", token=operator_token)
        assert status == 200 and [r["name"] for r in regions["regions"]] == ["dev-1"]
        # who is waiting: the tenant, with its live job (retrying, or pending/running between tries)
        (waiting,) = [t for t in regions["regions"][0]["tenants"] if t["tenant"] == mine["tenant"]]
        assert waiting["pending"] + waiting["running"] + waiting["retry"] >= 1 and waiting["running_cap"] is None
        status, detail = stack.api("GET", f"operator/jobs/{job_id}", token=operator_token)
        assert status == 200 and detail["job"]["actor"] and detail["job"]["request_id"]
        assert [j["id"] for j in detail["history"]] == [job_id]

        page = new_page(chromium)
        sign_in(page, stack, operator_token)
        page.click("nav >> text=Operator")
        page.wait_for_selector("h2:text-is('Regions')")
        page.goto(stack.console + "operator?region=dev-1&status=retry")
        row = page.wait_for_selector(f"tr:has(code:text-is('{job_id}'))")
        text = row.inner_text()
        assert "ServerCreate" in text and "retry: on its way" in text and "Service Unavailable" in text, text
        # tenants by name (the id on hover and in the link that lists the tenant's jobs)
        assert mine["tenant_name"] and mine["tenant_name"] in page.inner_text(
            "[aria-label='Who is waiting: tenants by pending jobs']")
        assert page.locator(f"[aria-label='Who is waiting: tenants by pending jobs'] [data-tenant='{mine['tenant']}']"
                            ).first.inner_text() == mine["tenant_name"]
        # cancel it (a running attempt answers 409: the page shows why; the next retry is cancellable)
        deadline = time.monotonic() + 300
        while True:
            page.click(f"[aria-label='Cancel {job_id}']")
            job = stack.api("GET", f"jobs/{job_id}?wait_s=5")[1]
            if job["status"] == "failed":
                break
            assert time.monotonic() < deadline, job
            page.goto(stack.console + "operator?region=dev-1")
            page.wait_for_selector(f"[aria-label='Cancel {job_id}']")
        assert job["error"]["class"] == "cancelled", job
        page.goto(stack.console + f"operator/jobs/{job_id}")
        page.wait_for_selector(".job .job-status[data-status=failed]")
        assert "cancelled" in page.inner_text("main")
        assert page.console_errors == [] or all("409" in e for e in page.console_errors), page.console_errors
    finally:
        stack.sim("DELETE", f"/faults/{fault['id']}")


JOBS = "[role=region][aria-label^='Jobs:']"  # the table of every tenant's jobs


def test_operator_jobs_go_page_by_page_and_filter_by_tenant(stack: DevStack, chromium: Any, operator_token: str) -> None:
    """Every tenant's jobs a page at a time (the API's page tokens), the filters kept from page to
    page; a tenant's name lists that tenant's jobs alone."""
    other = stack.token_for("initech", "read", "write")
    for token in (None, other, None):
        status, out = stack.api("POST", "servers", {"name": f"opage-{time.time_ns() % 10**8}", "region": "dev-1",
                                                    "image": "debian-12", "cores": 1, "memory_mib": 1024,
                                                    "disk_gib": 10}, token=token)
        assert status == 202, out
    page = new_page(chromium)
    sign_in(page, stack, operator_token)
    page.goto(stack.console + "operator?limit=1&kind=ServerCreate")
    first = page.locator(f"{JOBS} tbody tr td code").first.inner_text()
    page.click("text=Next page →")
    page.wait_for_url("**after=**")
    assert "kind=ServerCreate" in page.url and "limit=1" in page.url
    page.wait_for_selector("nav.pages a:text-is('First page')")
    second = page.locator(f"{JOBS} tbody tr td code").first.inner_text()
    assert second != first
    assert page.locator(f"{JOBS} tbody tr").count() == 1
    page.goto(stack.console + "operator?kind=ServerCreate")
    page.click(f"{JOBS} a:has(.tenant:text-is('initech'))")
    page.wait_for_url("**tenant=ten_**")
    page.wait_for_selector(f"{JOBS} tbody tr")
    names = set(page.locator(f"{JOBS} tbody tr td:nth-child(2)").all_inner_texts())
    assert names == {"initech"}, names
    assert page.console_errors == [], page.console_errors
