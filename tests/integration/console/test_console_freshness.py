"""A resource's page stays true without a reload (Debian's chromium through Playwright): a job
started elsewhere (the API, the CLI) shows on the resource's page and its list, followed live,
and the page says "not ready" while it runs; a failed read of the jobs is no "no jobs" (readiness
unknown, never "ready"); every kind's settled statuses read as ready (a volume's available and
attached too); and a double click on an action or on the delete confirmation sends one request,
with an Idempotency-Key."""
from __future__ import annotations

import json
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

# statuses on the way somewhere, or no longer anything: never "ready"
UNSETTLED = {"creating", "updating", "deleting", "destroying", "deleted", "failed", "degraded"}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevStack]:
    require_browser()
    yield from dev_stack(tmp_path_factory.mktemp("console-fresh"))


@pytest.fixture(scope="module")
def chromium(stack: DevStack) -> Iterator[Any]:
    yield from browser()


def _server(stack: DevStack, name: str) -> str:
    status, out = stack.api("POST", "servers", {"name": f"{name}-{time.time_ns() % 10**8}", "region": "dev-1",
                                                "image": "debian-12", "cores": 1, "memory_mib": 1024, "disk_gib": 10})
    assert status == 202, out
    assert stack.wait_job(out["job"]["id"])["status"] == "succeeded"
    return str(out["server"]["id"])


def test_a_job_started_elsewhere_shows_on_the_resources_page(stack: DevStack, chromium: Any) -> None:
    """The page opened once the server is ready; a reboot asked through the API (its PVE call
    refused, so it stays on its way until the test lets it through) turns the page "not ready",
    names the job and follows it, and the list's row too — without a reload."""
    sid = _server(stack, "elsewhere")
    page = new_page(chromium)
    sign_in(page, stack)
    page.goto(f"{stack.console}servers/{sid}")
    page.wait_for_selector("#main > div > p .readiness[data-ready=true]")
    listing = new_page(chromium)
    sign_in(listing, stack)
    listing.goto(f"{stack.console}servers")
    row = listing.locator(f"tr:has(a[href$='{sid}'])")
    row.locator(".badge.ok:text-is('running')").wait_for()
    fault = stack.sim("POST", "/faults", {"method": "POST", "path": "/status/reboot", "action": "error", "status": 500,
                                          "reason": "simulated: reboot refused", "probability": 1.0})
    try:
        status, out = stack.api("POST", f"servers/{sid}/actions/reboot", {})
        assert status == 202, out
        page.wait_for_selector("#main > div > p .readiness[data-ready=false]")
        assert "ServerReboot" in page.inner_text("#main > div > p .readiness")
        page.wait_for_selector(f".job[data-job='{out['job']['id']}']")  # followed live on this page
        row.locator(".readiness[data-ready=false]").wait_for()
    finally:
        stack.sim("DELETE", f"/faults/{fault['id']}")
    page.wait_for_selector(f".job[data-job='{out['job']['id']}'] .job-status[data-status=succeeded]")
    page.wait_for_selector("#main > div > p .readiness[data-ready=true]")
    assert page.console_errors == [] and listing.console_errors == [], (page.console_errors, listing.console_errors)


def test_a_failed_read_of_the_jobs_claims_no_readiness(stack: DevStack, chromium: Any) -> None:
    """The jobs lists answer 503: the page and the list say readiness unknown, never ready."""
    sid = _server(stack, "unread")
    page = new_page(chromium)
    sign_in(page, stack)
    page.route("**/v1/jobs?**", lambda route: route.fulfill(status=503, content_type="application/json",
                                                            body=json.dumps({"error": {"message": "down"}})))
    page.goto(f"{stack.console}servers/{sid}")
    page.wait_for_selector("#main > div > p .readiness[data-ready=unknown]")
    assert page.locator(".readiness[data-ready=true]").count() == 0
    page.goto(f"{stack.console}servers")
    page.locator(f"tr:has(a[href$='{sid}']) .readiness[data-ready=unknown]").wait_for()
    assert page.locator(".badge.ok:text-is('running')").count() == 0


def test_every_kinds_settled_statuses_read_as_ready(stack: DevStack, chromium: Any) -> None:
    """Each kind's status enum (the OpenAPI document's): every status but those on their way (or
    gone) is settled in the console; and a volume's page says ready once it is available."""
    status, doc = stack.api("GET", "openapi.json")
    assert status == 200

    def enums(schema: Any) -> set[str]:
        if not isinstance(schema, dict):
            return set()
        if "$ref" in schema:
            return enums(doc["components"]["schemas"][schema["$ref"].rsplit("/", 1)[-1]])
        out = set(schema.get("enum") or ())
        for k in ("anyOf", "oneOf", "allOf"):
            for s in schema.get(k, ()):
                out |= enums(s)
        return out

    statuses: dict[str, set[str]] = {}
    for path, ops in doc["paths"].items():
        if path.count("/") == 2 and path.endswith("/{id}") and "get" in ops:
            one = ops["get"]["responses"]["200"]["content"]["application/json"]["schema"]
            for prop in enums_props(doc, one):
                statuses[path.split("/")[1]] = enums(prop)
    assert {"servers", "volumes", "addresses", "load-balancers", "clusters"} <= set(statuses), statuses
    page = new_page(chromium)
    sign_in(page, stack)
    verdicts = page.evaluate("async (all) => { const m = await import('/console/static/status.js');"
                             " return Object.fromEntries(all.map((s) => [s, m.settled(s)])); }",
                             sorted(set().union(*statuses.values())))
    for plural, ss in statuses.items():
        assert ss, plural
        for s in ss:
            assert verdicts[s] == (s not in UNSETTLED), (plural, s, verdicts[s])
    status, out = stack.api("POST", "volumes", {"name": f"ready-{time.time_ns() % 10**8}", "region": "dev-1",
                                                "size_gib": 1})
    assert status == 202, out
    assert stack.wait_job(out["job"]["id"])["status"] == "succeeded"
    page.goto(f"{stack.console}volumes/{out['volume']['id']}")
    page.wait_for_selector("#main > div > p .readiness[data-ready=true]")
    assert page.locator("#main > div > p > .badge.ok:text-is('available')").count() == 1


def enums_props(doc: dict[str, Any], schema: dict[str, Any]) -> list[Any]:
    """The ``status`` property schema of the one resource a GET of one answers."""
    def deref(s: Any) -> Any:
        return doc["components"]["schemas"][s["$ref"].rsplit("/", 1)[-1]] if "$ref" in s else s
    outer = deref(schema)
    out = []
    for v in (outer.get("properties") or {}).values():
        inner = deref(v)
        if "status" in (inner.get("properties") or {}):
            out.append(inner["properties"]["status"])
    return out


def test_a_double_click_sends_one_request_with_an_idempotency_key(stack: DevStack, chromium: Any) -> None:
    """Reboot double-clicked: one POST (with an Idempotency-Key), one job. The delete confirmation
    double-clicked: one DELETE, no error shown, the server deleting."""
    sid = _server(stack, "twice")
    page = new_page(chromium)
    sign_in(page, stack)
    sent: list[Any] = []
    page.on("request", lambda r: sent.append(r) if f"/v1/servers/{sid}" in r.url and r.method != "GET" else None)
    page.goto(f"{stack.console}servers/{sid}")
    page.wait_for_selector("#main > div > p .readiness[data-ready=true]")
    with page.expect_response(lambda r: r.request.method == "POST" and r.url.endswith("/actions/reboot")) as resp:
        page.dblclick("[role=group][aria-label=Actions] [data-action=reboot]")
    assert resp.value.status == 202, resp.value.text()
    job = resp.value.json()["job"]["id"]
    assert stack.wait_job(job)["status"] == "succeeded"
    page.wait_for_selector(f".job[data-job='{job}'] .job-status[data-status=succeeded]")
    reboots = [r for r in sent if r.url.endswith("/actions/reboot")]
    assert len(reboots) == 1, [r.url for r in reboots]
    assert reboots[0].headers.get("idempotency-key"), reboots[0].headers
    _, jobs = stack.api("GET", f"jobs?resource_id={sid}&kind=ServerReboot")
    assert len(jobs["jobs"]) == 1, jobs
    page.wait_for_selector("#main > div > p .readiness[data-ready=true]")
    page.click("[data-action=delete]")
    with page.expect_response(lambda r: r.request.method == "DELETE") as resp:
        page.dblclick("[data-action=confirm-delete]")
    assert resp.value.status == 202, resp.value.text()
    page.wait_for_selector("p .badge:text-is('deleting')")
    assert len([r for r in sent if r.method == "DELETE"]) == 1
    assert page.locator(".notice.bad").count() == 0
    assert page.console_errors == [], page.console_errors


def test_operator_filters_keep_the_page_and_a_read_token_gets_no_cancel(stack: DevStack, chromium: Any) -> None:
    """A tenant's name typed where its id goes, or a page token from elsewhere: the refusal shows
    under the filters, the rest of the Operator page stays. A job waiting to retry: an operator
    token with write has its Cancel button, one with only read has none (the API would refuse it)."""
    fault = stack.sim("POST", "/faults", {"method": "POST", "path": "/firewall/ipset", "action": "error", "status": 500,
                                          "reason": "simulated: ipset refused", "probability": 1.0})
    try:
        status, out = stack.api("POST", "servers", {"name": f"ops-{time.time_ns() % 10**8}", "region": "dev-1",
                                                    "image": "debian-12", "cores": 1, "memory_mib": 1024,
                                                    "disk_gib": 10, "public_ipv4": True})
        assert status == 202, out
        assign = next(j["id"] for j in out["jobs"] if j["kind"] == "AddressAssign")
        writer = new_page(chromium)
        sign_in(writer, stack, stack.token_for("platform", "read", "write", "operator"))
        writer.goto(stack.console + "operator?status=retry&kind=AddressAssign")
        writer.wait_for_selector(f"tr:has(a[href$='{assign}']) [data-action=cancel-job]")
        reader = new_page(chromium)
        sign_in(reader, stack, stack.token_for("platform", "read", "operator"))
        reader.goto(stack.console + "operator?status=retry&kind=AddressAssign")
        reader.wait_for_selector(f"tr:has(a[href$='{assign}'])")
        assert reader.locator("[data-action=cancel-job]").count() == 0
    finally:
        stack.sim("DELETE", f"/faults/{fault['id']}")
    for query, said in (("tenant=no-such-tenant", "nor a tenant's name"), ("after=bogus", "after")):
        reader.goto(stack.console + f"operator?{query}")
        notice = reader.locator("form[role=search] + div .notice")
        notice.wait_for()
        assert said in notice.inner_text(), notice.inner_text()
        assert reader.locator("h1").inner_text() == "Operator"
        reader.wait_for_selector("caption:text-is('Regions: cap and live jobs')")  # the rest of the page is there
    reader.goto(stack.console + "operator?tenant=no-such-tenant")
    reader.wait_for_selector("[name=tenant][aria-invalid=true]")
    # the name a tenant is shown by filters by that tenant
    reader.goto(stack.console + "operator?tenant=platform&kind=AddressAssign")
    reader.wait_for_selector("caption:text-is('Jobs: 0'), p.muted:text-is('No jobs match.')")
    reader.goto(stack.console + f"operator?tenant={dev_tenant_name(stack)}&kind=AddressAssign")
    reader.wait_for_selector(f"tr:has(a[href$='{assign}'])")
    # the browser logs the refused reads (422) themselves; nothing else
    errors = [e for e in reader.console_errors if "status of 422" not in e]
    assert errors == [] and writer.console_errors == [], (reader.console_errors, writer.console_errors)


def dev_tenant_name(stack: DevStack) -> str:
    """The name of the dev token's tenant (what the console shows it as)."""
    status, jobs = stack.api("GET", "jobs?limit=1&order=newest")
    assert status == 200 and jobs["jobs"], jobs
    status, op = stack.api("GET", f"operator/jobs/{jobs['jobs'][0]['id']}",
                           token=stack.token_for("platform", "read", "operator"))
    assert status == 200, op
    return str(op["job"]["tenant_name"])


def test_the_sign_in_page_says_the_cookie_holds_a_session_not_the_token(stack: DevStack, chromium: Any) -> None:
    page = new_page(chromium)
    page.goto(stack.console + "sign-in")
    hint = page.locator("#token-hint").inner_text()
    assert "session id" in hint and "never the token" in hint and "It is kept in" not in hint, hint
