"""The web console, a customer's day in a real browser (Debian's chromium through Playwright):
sign in with a token, create a server from the form (checked against the OpenAPI document's
constraints before it is sent), watch its job's steps reach done through the long-poll without
a reload, see it running with what verify observed, delete it, restore it, sign out."""
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
    yield from dev_stack(tmp_path_factory.mktemp("console"))


@pytest.fixture(scope="module")
def chromium(stack: DevStack) -> Iterator[Any]:
    yield from browser()


def test_z9_dev_prints_the_console_next_to_the_api(stack: DevStack) -> None:
    assert f"API:        http://127.0.0.1:{stack.port}/v1" in stack.banner
    assert f"console:    http://127.0.0.1:{stack.port}/console/" in stack.banner


def test_the_page_has_a_strict_csp_and_no_inline_script(stack: DevStack) -> None:
    import urllib.request

    with urllib.request.urlopen(stack.console, timeout=60) as r:
        csp = r.headers["Content-Security-Policy"]
        html = r.read().decode()
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp and "unsafe-eval" not in csp
    assert "<script>" not in html and "onclick" not in html and "javascript:" not in html
    assert "http://" not in html.replace("http-equiv", "") and "https://" not in html  # nothing fetched from elsewhere


def test_server_created_watched_deleted_restored(stack: DevStack, chromium: Any) -> None:
    page = new_page(chromium)
    sign_in(page, stack)
    cookie = next(c for c in page.context.cookies() if c["name"] == "z9_console")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    assert page.evaluate("document.cookie") == ""  # the token is out of the scripts' reach
    assert page.evaluate("Object.keys(localStorage).length + Object.keys(sessionStorage).length") == 0

    page.click("nav >> text=Servers")
    page.click("text=Create server")
    page.wait_for_selector("form.form")
    name = f"web-{time.time_ns() % 10**8}"
    # the OpenAPI constraints refuse these before anything is sent
    page.fill("[name=name]", "Not A DNS Label")
    page.fill("[name=cores]", "500")
    sent: list[str] = []
    page.on("request", lambda r: r.method == "POST" and "/v1/servers" in r.url and sent.append(r.url))
    page.click("button:has-text('Create')")
    page.wait_for_selector("[data-field=cores] .error:not([hidden])")
    assert "at most 64" in page.inner_text("[data-field=cores] .error")
    assert page.get_attribute("[name=name]", "aria-invalid") == "true"
    # the refusal in the schema's words (its description), never the regex
    name_error = page.inner_text("[data-field=name] .error")
    assert "DNS label" in name_error and "^[a-z0-9]" not in name_error, name_error
    assert sent == []
    # labels in words; region and image: selects of what GET /v1/regions offers
    memory_id = page.get_attribute("[name=memory_mib]", "id")
    assert page.inner_text(f"label[for={memory_id}]").startswith("Memory (MiB)")
    assert page.eval_on_selector("[name=region]", "e => e.tagName") == "SELECT"
    assert page.eval_on_selector("[name=image]", "e => e.tagName") == "SELECT"

    page.fill("[name=name]", name)
    page.select_option("[name=region]", "dev-1")
    page.select_option("[name=image]", "debian-12")
    page.fill("[name=cores]", "1")
    page.fill("[name=memory_mib]", "1024")
    page.fill("[name=disk_gib]", "10")
    page.evaluate("window.__same_page = true")  # gone if the page reloads
    page.click("button:has-text('Create')")
    page.wait_for_selector(f"h1:has-text('{name}')")
    # the job's steps, live: pending → running → done, the page never reloaded
    page.wait_for_selector(".job .step-state[data-step=clone]")
    page.wait_for_selector(".job .job-status[data-status=succeeded]")
    states = page.eval_on_selector_all(".job .step-state", "els => els.map(e => e.dataset.state)")
    assert states and set(states) <= {"done", "skipped"}, states
    assert page.evaluate("window.__same_page") is True
    page.wait_for_selector("p .badge:text-is('running')")
    observed = page.inner_text("section:has(#obs-h)")
    assert "vmid" in observed and "running" in observed
    # the recent jobs follow the latest job: its create shows succeeded there too
    page.wait_for_selector("section:has(#hist-h) .badge:text-is('succeeded')")
    # a running server: Start makes no sense (observed running), Shut down does
    page.wait_for_selector("[data-action=start][disabled]")
    assert page.is_enabled("[data-action=shutdown]")

    page.click("[data-action=delete]")
    page.click("[data-action=confirm-delete]")
    page.wait_for_selector("p .badge:text-is('deleting')")
    page.wait_for_selector(".job .job-status[data-status=succeeded]")
    page.click("[data-action=cancel-deletion]")
    page.wait_for_selector("p .badge:text-is('running')")
    page.wait_for_selector(".job .job-status[data-status=succeeded]")
    assert page.evaluate("window.__same_page") is True

    page.click("text=Sign out")
    page.wait_for_selector("#token")
    assert not [c for c in page.context.cookies() if c["name"] == "z9_console"]
    page.goto(stack.console + "servers")
    page.wait_for_selector("#token")  # signed out: back to the sign-in
    assert page.console_errors == [], page.console_errors


# the elements whose content spills out of them, not scrolled (an assertion's message)
OVERFLOWING = """[...document.querySelectorAll('body *')].filter(e => e.scrollWidth > e.clientWidth + 1 && !['auto', 'scroll', 'hidden'].includes(getComputedStyle(e).overflowX))
  .slice(0, 8).map(e => e.tagName + '.' + e.className + ' ' + Math.round(e.getBoundingClientRect().right) + ' ' + getComputedStyle(e).overflowX)"""


def test_phone_sized_window_fits_and_errors_quote_the_request_id(stack: DevStack, chromium: Any) -> None:
    page = new_page(chromium, viewport={"width": 390, "height": 844})
    sign_in(page, stack)
    for path in ("servers/new", "load-balancers/new", "clusters/new"):
        page.goto(stack.console + path)
        page.wait_for_selector("form.form button[type=submit]")
        wide = page.evaluate("document.documentElement.scrollWidth")
        assert wide <= 390, (path, wide)
        box = page.locator("text=Sign out").bounding_box()
        assert box and box["x"] >= 0 and box["x"] + box["width"] <= 390, (path, box)
        page.click("form.form button[type=submit]")  # nothing lies over it (a trial click fails if so)
        page.wait_for_selector("form.form .notice.bad:not([hidden])")
    status, out = stack.api("POST", "servers", {"name": f"phone-{time.time_ns() % 10**8}", "region": "dev-1",
                                                "image": "debian-12", "cores": 1, "memory_mib": 1024, "disk_gib": 10})
    assert status == 202, out
    for path in ("", "servers", "jobs", "tokens", "quota", f"servers/{out['server']['id']}", f"jobs/{out['job']['id']}"):
        page.goto(stack.console + path)
        page.wait_for_selector("main h1")
        if path.startswith(("servers/", "jobs/")):
            page.wait_for_selector(".job .job-status")  # its job panel, steps and all
        else:
            page.wait_for_load_state("networkidle")
        wide = page.evaluate("document.documentElement.scrollWidth")
        assert wide <= 390, (path, wide, page.evaluate(OVERFLOWING))
    # a list of objects is rows of fields (no JSON box): a target's kind a select of the union's
    # branches, its server a picker of the tenant's servers; the form fits the narrow screen too
    page.goto(stack.console + "load-balancers/new")
    page.click("[data-field=targets] [data-add=targets]")
    page.wait_for_selector("select[name='targets[0].type']")
    assert page.eval_on_selector_all("select[name='targets[0].type'] option", "os => os.map(o => o.value)") == [
        "server", "ip"]
    page.wait_for_selector("select[name='targets[0].server_id'][data-ref=srv][data-state=ready]")
    assert out["server"]["id"] in page.eval_on_selector_all("select[name='targets[0].server_id'] option",
                                                            "os => os.map(o => o.value)")
    page.select_option("select[name='targets[0].type']", "ip")
    page.wait_for_selector("input[name='targets[0].ip']")
    assert page.locator("[name='targets[0].server_id']").count() == 0
    assert page.locator("textarea[name=_json]").is_hidden()  # raw JSON only behind the advanced switch
    page.check("[data-advanced]")
    assert '"targets"' in page.input_value("textarea[name=_json]")
    wide = page.evaluate("document.documentElement.scrollWidth")
    assert wide <= 390, ("load-balancers/new", wide, page.evaluate(OVERFLOWING))
    # an API refusal shows the request id the API answered
    page.goto(stack.console + "servers/srv_" + "0" * 26)
    page.wait_for_selector(".notice.bad .request-id code")
    assert page.inner_text(".notice.bad .request-id code").strip()
    assert page.console_errors == [] or all("404" in e for e in page.console_errors), page.console_errors


def test_the_jobs_page_goes_page_by_page_and_filters_by_kind(stack: DevStack, chromium: Any) -> None:
    for _ in range(2):  # at least three jobs of the tenant (the other tests' and these)
        status, out = stack.api("POST", "servers", {"name": f"pages-{time.time_ns() % 10**8}", "region": "dev-1",
                                                    "image": "debian-12", "cores": 1, "memory_mib": 1024, "disk_gib": 10})
        assert status == 202, out
    page = new_page(chromium)
    sign_in(page, stack)
    page.goto(stack.console + "jobs?limit=1")
    first = page.locator("table tbody tr td code").first.inner_text()
    page.click("text=Older jobs →")
    page.wait_for_url("**after=**")
    page.wait_for_selector("table tbody tr")
    second = page.locator("table tbody tr td code").first.inner_text()
    assert second != first and page.locator("nav.pages a:text-is('Newest')").count() == 1
    page.goto(stack.console + "jobs")
    page.fill("#j-kind", "ServerCreate")
    page.click("form.filters button[type=submit]")
    page.wait_for_url("**kind=ServerCreate**")
    page.wait_for_selector("table tbody tr")
    kinds = set(page.locator("table tbody tr td:nth-child(2)").all_inner_texts())
    assert kinds == {"ServerCreate"}, kinds
    page.goto(stack.console + "jobs?kind=Bogus")
    page.wait_for_selector(".notice.bad:has-text('no job kind')")


def test_a_servers_page_lists_the_jobs_of_its_address_too(stack: DevStack, chromium: Any) -> None:
    """A server with a public address: its page lists the address's AddressAssign next to its own
    ServerCreate (the jobs of every resource tied to it: ?server_id= lists)."""
    status, out = stack.api("POST", "servers", {"name": f"tied-{time.time_ns() % 10**8}", "region": "dev-1",
                                                "image": "debian-12", "cores": 1, "memory_mib": 1024, "disk_gib": 10,
                                                "public_ipv4": True})
    assert status == 202, out
    kinds = {j["kind"] for j in out["jobs"]}
    assert "AddressAssign" in kinds, out["jobs"]
    for j in out["jobs"]:
        stack.wait_job(j["id"])
    page = new_page(chromium)
    sign_in(page, stack)
    page.goto(f"{stack.console}servers/{out['server']['id']}")
    page.wait_for_selector("table:has(caption:has-text('tied to it')) td:text-is('AddressAssign')")
    page.wait_for_selector("table:has(caption:has-text('tied to it')) td:text-is('ServerCreate')")


def test_a_create_form_shows_its_region_and_image_as_selects_from_the_start(stack: DevStack, chromium: Any) -> None:
    # the regions are held back: the page says it is loading and shows no form meanwhile — the
    # fields are never text boxes that turn into selects under the user's (or a test's) hands
    page = new_page(chromium)
    sign_in(page, stack)
    held: list[Any] = []
    page.route("**/v1/regions", lambda route: held.append(route))
    page.click("nav >> text=Servers")
    with page.expect_request("**/v1/regions"):
        page.click("text=Create server")
    page.wait_for_selector("text=Loading the regions and images offered")
    assert page.locator("[name=region]").count() == 0 and page.locator("[name=image]").count() == 0
    deadline = time.monotonic() + 60
    while not held:  # the route handler runs while Playwright processes events: let it, until it has
        assert time.monotonic() < deadline, "the held request never reached its route handler"
        page.wait_for_timeout(20)
    held[0].continue_()
    page.wait_for_selector("form.form")
    assert page.eval_on_selector("[name=region]", "e => e.tagName") == "SELECT"
    assert page.eval_on_selector("[name=image]", "e => e.tagName") == "SELECT"
    page.select_option("[name=region]", "dev-1")
    assert page.console_errors == [], page.console_errors


class _JobReadsHeld:
    """The page's reads of one job (its live panel) held in the browser: the page refreshes the
    resource when an answer comes, and only then. ``release()`` lets them through, held and new."""

    def __init__(self, page: Any) -> None:
        self.page, self.released = page, False
        self.held: list[Any] = []
        page.route(lambda url: "/v1/jobs/job_" in url, self._route)

    def _route(self, route: Any) -> None:
        if self.released:
            route.continue_()
        else:
            self.held.append(route)

    def wait_held(self) -> None:
        deadline = time.monotonic() + 120
        while not self.held:  # the route handler runs while Playwright processes events: let it, until it has
            assert time.monotonic() < deadline, "the page never read its job"
            self.page.wait_for_timeout(20)

    def release(self) -> None:
        self.released = True
        for r in self.held:
            r.continue_()


def test_an_open_form_stays_through_the_pages_live_refresh(stack: DevStack, chromium: Any) -> None:
    """A resource's page refreshes itself whenever the job it follows changes. An action's form
    being filled in, and a delete confirmation about to be clicked, stay where they are through it
    (the same elements, what was typed kept); the action bar is redrawn only when what it offers
    changed. The job's answer is held in the browser until the form is open, so the refresh comes
    while it is open, every time."""
    status, out = stack.api("POST", "servers", {"name": f"stay-{time.time_ns() % 10**8}", "region": "dev-1",
                                                "image": "debian-12", "cores": 1, "memory_mib": 1024, "disk_gib": 10})
    assert status == 202, out
    assert stack.wait_job(out["job"]["id"])["status"] == "succeeded"
    sid = out["server"]["id"]
    page = new_page(chromium)
    sign_in(page, stack)

    # 1. the resize form open, a value typed; the server powered off meanwhile: the refresh that
    # follows changes the bar (Start offered again) and leaves the form as it was
    held = _JobReadsHeld(page)
    page.goto(f"{stack.console}servers/{sid}")
    page.wait_for_selector("[data-action=start][disabled]")
    held.wait_held()
    page.click("[role=group][aria-label=Actions] [data-action=resize]")
    form = page.locator("[role=group][aria-label=Actions] ~ div form")
    form.locator("[name=cores]").fill("2")
    form.evaluate("f => { window.__form = f; }")
    status, off = stack.api("POST", f"servers/{sid}/actions/poweroff", {})
    assert status == 202, off
    assert stack.wait_job(off["job"]["id"])["status"] == "succeeded"
    held.release()
    page.wait_for_selector("[data-action=start]:not([disabled])")  # the refresh has redrawn the bar
    assert page.evaluate("window.__form.isConnected && window.__form === document.querySelector("
                         "'[role=group][aria-label=Actions] ~ div form')"), "the open form was taken away"
    assert form.locator("[name=cores]").input_value() == "2"

    # 2. a delete confirmation open; the refresh changes nothing the bar offers: neither the bar
    # nor the confirmation is redrawn, and its button deletes
    page.unroute_all()
    held = _JobReadsHeld(page)
    page.goto(f"{stack.console}servers/{sid}")
    page.wait_for_selector("[data-action=start]:not([disabled])")
    held.wait_held()
    page.click("[data-action=delete]")
    page.wait_for_selector("[data-action=confirm-delete]")
    page.evaluate("""() => {
        window.__confirm = document.querySelector('[data-action=confirm-delete]');
        window.__bar = document.querySelector('[role=group][aria-label=Actions]');
        document.querySelector('#main > div > p').__before = true;
    }""")
    held.release()
    # the refresh has rendered: the head's line is drawn anew by every render
    page.wait_for_function("() => { const p = document.querySelector('#main > div > p'); return p && !p.__before; }")
    assert page.evaluate("window.__confirm.isConnected"), "the delete confirmation was taken away"
    assert page.evaluate("window.__bar === document.querySelector('[role=group][aria-label=Actions]')")
    with page.expect_response(lambda r: r.request.method == "DELETE" and f"/v1/servers/{sid}" in r.url) as resp:
        page.click("[data-action=confirm-delete]")
    assert resp.value.status == 202, resp.value.text()
    page.wait_for_selector("p .badge:text-is('deleting')")
    page.wait_for_selector("[data-action=cancel-deletion]")
    assert page.locator("[data-action=confirm-delete]").count() == 0  # sent: the confirmation closed
    assert page.console_errors == [], page.console_errors


def test_a_server_is_ready_only_once_its_public_address_is_in_place(stack: DevStack, chromium: Any) -> None:
    """`z9 servers create --public-ipv4 --wait` returns once the ServerCreate and the address's
    AddressAssign (which runs after it) have both succeeded. The server's page says "ready" only
    then: before, it says not ready, names the job it waits for, follows that job live, and does not
    show the server's `running` as done. The simulator refuses the address's IP filter set (the
    AddressAssign retries) until the test lets it through."""
    fault = stack.sim("POST", "/faults", {"method": "POST", "path": "/firewall/ipset", "action": "error", "status": 500,
                                          "reason": "simulated: ipset refused", "probability": 1.0})
    try:
        status, out = stack.api("POST", "servers", {"name": f"ready-{time.time_ns() % 10**8}", "region": "dev-1",
                                                    "image": "debian-12", "cores": 1, "memory_mib": 1024,
                                                    "disk_gib": 10, "public_ipv4": True})
        assert status == 202, out
        jobs = {j["kind"]: j["id"] for j in out["jobs"]}
        assert stack.wait_job(jobs["ServerCreate"])["status"] == "succeeded"
        page = new_page(chromium)
        sign_in(page, stack)
        page.goto(f"{stack.console}servers/{out['server']['id']}")
        page.wait_for_selector("#main > div > p .readiness[data-ready=false]")
        assert "AddressAssign" in page.inner_text(".readiness")
        page.wait_for_selector(f".job[data-job='{jobs['AddressAssign']}']")  # the address's job, live, on this page
        status_badge = page.locator("#main > div > p > .badge").first
        assert status_badge.inner_text() == "running" and "ok" not in (status_badge.get_attribute("class") or "")
        assert page.locator(".readiness[data-ready=true]").count() == 0
        # the list says so too (in another tab: this one waits, unreloaded, for the job to end)
        listing = new_page(chromium)
        sign_in(listing, stack)
        listing.goto(f"{stack.console}servers")
        row = listing.locator(f"tr:has(a[href$='{out['server']['id']}'])")
        row.locator(".readiness[data-ready=false]").wait_for()
        assert row.locator(".badge.ok").count() == 0
    finally:
        stack.sim("DELETE", f"/faults/{fault['id']}")
    page.wait_for_selector(f".job[data-job='{jobs['AddressAssign']}'] .job-status[data-status=succeeded]")
    page.wait_for_selector("#main > div > p .readiness[data-ready=true]")  # without a reload
    assert "ok" in (page.locator("#main > div > p > .badge").first.get_attribute("class") or "")
    assert stack.api("GET", f"jobs/{jobs['AddressAssign']}")[1]["status"] == "succeeded"
    listing.reload()
    row.locator(".badge.ok:text-is('running')").wait_for()
    assert row.locator(".readiness").count() == 0
    assert page.console_errors == [] and listing.console_errors == [], (page.console_errors, listing.console_errors)
