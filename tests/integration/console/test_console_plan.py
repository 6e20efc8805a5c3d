"""The console's Plan button, in a real browser against `z9 dev`: a resource's page plans it (POST
…/actions/plan, generated from the document: an action answering 200 without a job) and shows "in
sync", or the drift and the steps — each saying whether it interrupts the guest — after a change made
by hand through the simulator's PVE API; a read-only token has the button too; a type without a plan
route (a network) has none."""
from __future__ import annotations

import json
import ssl
import time
import urllib.parse
import urllib.request
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
    # the reaper plans every live resource each second (its drift shows on the Operator page)
    yield from dev_stack(tmp_path_factory.mktemp("console-plan"), Z9_DRIFT_INTERVAL_S="1")


@pytest.fixture(scope="module")
def chromium(stack: DevStack) -> Iterator[Any]:
    yield from browser()


def _pve_put(stack: DevStack, path: str, **params: Any) -> None:
    """A change by hand through the simulator's PVE API (a root token made for it, as `pveum` would)."""
    token = stack.sim("POST", "/tokens", {"tokenid": "root@pam!byhand", "privsep": False})["value"]
    url = (stack.data_dir / "sim-url").read_text().strip() + "/api2/json" + path
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    req = urllib.request.Request(url, data=urllib.parse.urlencode(params).encode(), method="PUT",
                                 headers={"Authorization": f"PVEAPIToken=root@pam!byhand={token}"})
    with urllib.request.urlopen(req, timeout=60, context=ctx) as r:
        json.loads(r.read())


def test_plan_button_shows_in_sync_then_the_drift_and_steps(stack: DevStack, chromium: Any) -> None:
    status, out = stack.api("POST", "servers", {"name": f"plan-{time.time_ns() % 10**8}", "region": "dev-1",
                                                "image": "debian-12", "cores": 1, "memory_mib": 1024, "disk_gib": 10})
    assert status == 202, out
    assert stack.wait_job(out["job"]["id"], 600)["status"] == "succeeded"
    sid = out["server"]["id"]
    page = new_page(chromium)
    logs: list[str] = []
    page.on("console", lambda m: logs.append(f"{m.type}: {m.text}"))
    page.on("pageerror", lambda e: logs.append(f"pageerror: {e}"))
    page.on("response", lambda r: logs.append(f"{r.request.method} {r.url} {r.status}") if "/v1/" in r.url else None)
    sign_in(page, stack)
    page.goto(f"{stack.console}servers/{sid}")
    page.click("[data-action=plan]")
    from playwright.sync_api import TimeoutError as PageTimeout

    try:
        page.wait_for_selector("section.plan, .notice.bad", timeout=60_000)
    except PageTimeout:
        raise AssertionError("\n".join(logs) + "\n---\n" + page.inner_text("body")) from None
    assert page.locator("section.plan[data-in-sync=true]").count() == 1, page.inner_text("main")
    assert "would change nothing" in page.inner_text("section.plan")

    status, srv = stack.api("GET", f"servers/{sid}")
    obs = srv["server"]["observed"]
    _pve_put(stack, f"/nodes/{obs['node']}/qemu/{obs['vmid']}/config", cores=4)
    page.click("[data-action=plan]")
    page.wait_for_selector("section.plan[data-in-sync=false]")
    text = page.inner_text("section.plan")
    assert "config.cores" in text and "configure" in text and "not interrupted" in text, text
    assert "disruptive" not in text.replace("not interrupted", ""), text

    status, made = stack.api("POST", "tokens", {"name": "ro", "scopes": ["read"]})
    assert status == 201, made
    ro = made["secret"]
    page2 = new_page(chromium)
    sign_in(page2, stack, ro)
    page2.goto(f"{stack.console}servers/{sid}")
    page2.click("[data-action=plan]")
    page2.wait_for_selector("section.plan[data-in-sync=false]")
    assert page2.locator("[data-action=delete]").count() == 0  # a read token: the plan, nothing that writes

    # a type the document has no plan route for (a network: no ResourceType.plan_of) has no Plan button
    status, net = stack.api("POST", "networks", {"name": f"plan-{time.time_ns() % 10**8}", "region": "dev-1",
                                                  "ip_range": "10.77.0.0/24"})
    assert status == 202, net
    page.goto(f"{stack.console}networks/{net['network']['id']}")
    page.wait_for_selector("[data-action=delete]")
    assert page.locator("[data-action=plan]").count() == 0, page.inner_text("main")

    # the reaper's periodic plan found it too: the Operator page lists it with its drift and steps
    page3 = new_page(chromium)
    sign_in(page3, stack, stack.token_for("dev", "read", "write", "operator"))
    page3.goto(f"{stack.console}operator")
    row = page3.wait_for_selector(f"tr:has(code:text-is('{sid}'))")
    assert "config.cores: want 1, have 4" in row.inner_text() and "configure" in row.inner_text()
