"""The web console's boundaries in a real browser: a read token sees no mutation control and the
API refuses a forged one (403); another tenant's resource id typed into the address bar is not
found; a cookie-authenticated POST without the session's CSRF token is refused; bearer-token
clients are unchanged."""
from __future__ import annotations

import time
from typing import Any, Iterator

import pytest

from tests.integration.console.console_support import DevStack, browser, dev_stack, new_page, require_browser, sign_in

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevStack]:
    require_browser()
    yield from dev_stack(tmp_path_factory.mktemp("console-access"))


@pytest.fixture(scope="module")
def chromium(stack: DevStack) -> Iterator[Any]:
    yield from browser()


@pytest.fixture(scope="module")
def server(stack: DevStack) -> str:
    status, out = stack.api("POST", "servers", {"name": f"acc-{time.time_ns() % 10**8}", "region": "dev-1",
                                                "image": "debian-12", "cores": 1, "memory_mib": 1024, "disk_gib": 10})
    assert status == 202, out  # a bearer client, no CSRF token: unchanged
    assert stack.wait_job(out["job"]["id"])["status"] == "succeeded"
    return out["server"]["id"]


def test_a_read_token_sees_a_read_only_console_and_forged_mutations_are_refused(stack: DevStack, chromium: Any,
                                                                                  server: str) -> None:
    status, out = stack.api("POST", "tokens", {"name": "viewer", "scopes": ["read"]})
    assert status == 201, out
    page = new_page(chromium)
    sign_in(page, stack, out["secret"])
    page.goto(stack.console + "servers")
    page.wait_for_selector("table")
    assert page.locator("text=Create server").count() == 0
    page.goto(stack.console + f"servers/{server}")
    page.wait_for_selector("#obs-h")
    page.wait_for_selector(".job .job-status")
    # nothing that writes; the plan (it only reads: test_console_plan.py) a read token has
    assert page.locator("[data-action]:not([data-action=plan])").count() == 0
    assert page.locator("[data-action=plan]").count() == 1
    page.goto(stack.console + "tokens")
    page.wait_for_selector("table")
    assert page.locator("text=Create a token").count() == 0 and page.locator("[data-action=revoke]").count() == 0
    # a forged mutation, with the session's own CSRF token: the API refuses it for the scope
    answer = page.evaluate("""async (id) => {
        const s = await (await fetch('/console/session')).json();
        const r = await fetch(`/v1/servers/${id}`, {method: 'DELETE', headers: {'X-CSRF-Token': s.csrf_token}});
        return [r.status, (await r.json()).error.code];
    }""", server)
    assert answer == [403, "insufficient_scope"]
    assert stack.api("GET", f"servers/{server}")[1]["server"]["status"] == "running"


def test_another_tenants_resource_is_not_found(stack: DevStack, chromium: Any, server: str) -> None:
    other = stack.token_for("other-tenant")
    page = new_page(chromium)
    sign_in(page, stack, other)
    page.goto(stack.console + f"servers/{server}")
    page.wait_for_selector("h1:text-is('Not found')")
    assert "no server" in page.inner_text("main").lower()


def test_a_cookie_post_without_the_csrf_token_is_refused(stack: DevStack, chromium: Any) -> None:
    page = new_page(chromium)
    sign_in(page, stack)
    body = {"name": f"csrf-{time.time_ns() % 10**8}", "region": "dev-1", "image": "debian-12", "cores": 1,
            "memory_mib": 1024, "disk_gib": 10}
    answer = page.evaluate("""async (body) => {
        const out = [];
        for (const h of [{}, {'X-CSRF-Token': 'forged'}]) {
            const r = await fetch('/v1/servers', {method: 'POST', body: JSON.stringify(body),
                                                   headers: {'Content-Type': 'application/json', ...h}});
            out.push([r.status, (await r.json()).error.code]);
        }
        return out;
    }""", body)
    assert answer == [[403, "csrf_failed"], [403, "csrf_failed"]]
    # another site's form post: the cookie is SameSite=Strict and the Origin is checked too
    r = page.context.request.post(stack.base + "/v1/servers", data=body, headers={"Origin": "https://evil.example"})
    assert r.status == 403 and r.json()["error"]["code"] == "csrf_failed"
    assert stack.api("GET", f"servers?name={body['name']}")[1]["servers"] == []
    # the sign-out itself needs the CSRF token
    r = page.context.request.delete(stack.base + "/console/session")
    assert r.status == 403


def test_the_session_cookie_is_secure_over_https_and_never_for_a_bad_token(stack: DevStack) -> None:
    import json
    import urllib.error
    import urllib.request

    def sign_in_call(token: str, **headers: str) -> tuple[int, str]:
        req = urllib.request.Request(stack.base + "/console/session", data=json.dumps({"token": token}).encode(),
                                     method="POST", headers={"Content-Type": "application/json", **headers})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, r.headers.get("Set-Cookie", "")
        except urllib.error.HTTPError as e:
            return e.code, e.headers.get("Set-Cookie", "") or ""

    status, cookie = sign_in_call(stack.token, **{"X-Forwarded-Proto": "https"})
    assert status == 200 and "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Secure" in cookie, cookie
    status, cookie = sign_in_call(stack.token)
    assert status == 200 and "Secure" not in cookie  # plain http (z9 dev): a Secure cookie would never come back
    status, cookie = sign_in_call("z9t_forged")
    assert status == 401 and cookie == ""
    status, cookie = sign_in_call(stack.token, Origin="https://evil.example")
    assert status == 403 and cookie == ""
