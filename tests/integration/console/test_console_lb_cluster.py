"""The web console in a real browser: a load balancer and a Kubernetes cluster created from the
console's forms reach healthy / running with their steps live, and the cluster's kubeconfig
downloads."""
from __future__ import annotations

import time
from typing import Any, Iterator

import pytest

from tests.integration.console.console_support import (
    DevStack,
    browser,
    dev_stack,
    fill_form,
    import_lb_appliance,
    new_page,
    require_browser,
    sign_in,
)

pytestmark = pytest.mark.timeout(1200)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevStack]:
    require_browser()
    yield from dev_stack(tmp_path_factory.mktemp("console-lb"), Z9_LB_HEALTH_INTERVAL_S="2")


@pytest.fixture(scope="module")
def chromium(stack: DevStack) -> Iterator[Any]:
    yield from browser()


def _web_server(stack: DevStack) -> str:
    status, out = stack.api("POST", "servers", {"name": f"lbweb-{time.time_ns() % 10**8}", "region": "dev-1",
                                                "image": "debian-12", "cores": 1, "memory_mib": 1024, "disk_gib": 10,
                                                "public_ipv4": True})
    assert status == 202, out
    for j in out["jobs"]:
        assert stack.wait_job(j["id"])["status"] == "succeeded"
    _, srv = stack.api("GET", f"servers/{out['server']['id']}")
    stack.sim("POST", f"/guests/{srv['server']['observed']['vmid']}/listen", {"port": 8080})
    return out["server"]["id"]


def test_load_balancer_from_the_console_reaches_healthy(stack: DevStack, chromium: Any) -> None:
    import_lb_appliance(stack)
    web = _web_server(stack)
    page = new_page(chromium)
    sign_in(page, stack)
    page.click("nav >> text=Load balancers")
    page.click("text=Create load balancer")
    name = f"front-{time.time_ns() % 10**8}"
    page.fill("[name=name]", name)
    page.select_option("[name=region]", "dev-1")
    form = page.locator("form.form")
    # a list of objects is rows of fields (a service's health check a union: tcp or http; a target
    # one of server or ip, the server picked from the tenant's own), never a JSON text box
    assert page.locator("textarea[name=services], textarea[name=targets]").count() == 0
    fill_form(form, {"services": [{"protocol": "tcp", "listen_port": 80, "destination_port": 8080,
                                   "health_check": {"protocol": "tcp", "port": 8080, "interval_s": 3,
                                                    "timeout_s": 2, "retries": 2}}],
                     "targets": [{"type": "server", "server_id": web}]}, {"srv": web})
    page.click("button:has-text('Create')")
    page.wait_for_selector(f"h1:has-text('{name}')")
    page.wait_for_selector(".job .step-state")  # its steps, live
    page.wait_for_selector(".job .job-status[data-status=succeeded]", timeout=600_000)
    page.wait_for_selector(".job th:text-is('member')")  # each step names the appliance it acts on
    page.wait_for_selector(".job .step-state[data-member=lb-0][data-step=clone]")
    # health comes from the periodic observe: the page shows it once the job's change refreshed it
    lb_id = page.url.rsplit("/", 1)[-1]
    deadline = time.monotonic() + 300
    while stack.api("GET", f"load-balancers/{lb_id}")[1]["load_balancer"]["health"] != "healthy":
        assert time.monotonic() < deadline, "the load balancer never became healthy"
        page.wait_for_timeout(1000)
    page.reload()
    page.wait_for_selector("p .badge:text-is('healthy')")
    assert page.console_errors == [], page.console_errors


def test_cluster_from_the_console_runs_and_its_kubeconfig_downloads(stack: DevStack, chromium: Any) -> None:
    page = new_page(chromium, accept_downloads=True)
    sign_in(page, stack)
    page.click("nav >> text=Clusters")
    page.click("text=Create cluster")
    name = f"demo-{time.time_ns() % 10**8}"
    page.fill("[name=name]", name)
    page.select_option("[name=region]", "dev-1")
    page.select_option("[name=version]", "1.33")
    page.select_option("[name='control_plane.count']", "1")
    page.fill("[name='control_plane.cores']", "2")
    page.fill("[name='control_plane.memory_mib']", "4096")
    page.fill("[name='control_plane.disk_gib']", "30")
    assert page.locator("textarea[name=node_pools]").count() == 0
    fill_form(page.locator("form.form"), {"node_pools": [{"name": "workers", "count": 1, "cores": 2,
                                                          "memory_mib": 4096, "disk_gib": 30}]}, {})
    page.click("button:has-text('Create')")
    page.wait_for_selector(f"h1:has-text('{name}')")
    page.wait_for_selector(".job .step-state")
    page.wait_for_selector(".job .job-status[data-status=succeeded]", timeout=900_000)
    page.wait_for_selector("p .badge:text-is('running')")
    with page.expect_download() as dl:
        page.click("[data-action=kubeconfig]")
    path = dl.value.path()
    text = open(path).read()
    assert "apiVersion: v1" in text and "client-certificate-data" in text and name in text
    assert page.console_errors == [], page.console_errors
