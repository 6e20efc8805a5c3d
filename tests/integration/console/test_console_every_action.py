"""Every action of every kind, from the console, in a real browser — generated from the OpenAPI
document: for each resource kind the API serves (``/{plural}`` with a create and ``/{plural}/{id}``)
one is made, then each of its actions (``/{plural}/{id}/actions/{name}``, the deprecated aliases
left out) is opened from the resource's page, its form (generated from the request schema: rows
of fields for a list of objects, selects for enums and for a union's branches, pickers of the
tenant's resources for ids) filled from the document's example of that request, submitted, and
its job watched to ``succeeded``. A new action, or a new kind, is covered without a new test.

``cancel-deletion`` is reached by deleting the resource first; an action the page says is not
possible now (start on a running server) is tried again after the others."""
from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import pytest
from z9.api.app import served_document

from tests.integration.console.console_support import (
    DevStack,
    browser,
    dev_stack,
    fill_form,
    import_lb_appliance,
    new_page,
    real_ids,
    require_browser,
    sign_in,
)

pytestmark = pytest.mark.timeout(1800)

DOC = served_document()


def _example(op: dict[str, Any]) -> Any:
    content = op["requestBody"]["content"]["application/json"]
    if "example" in content:
        return content["example"]
    if content.get("examples"):
        return next(iter(content["examples"].values()))["value"]
    ref = content["schema"].get("$ref", "").rsplit("/", 1)[-1]
    return (DOC["components"]["schemas"].get(ref, {}).get("examples") or [None])[0]


def kinds() -> dict[str, list[tuple[str, dict[str, Any]]]]:
    """{plural: [(action, its POST operation)]} as the document declares them."""
    out: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for path, ops in DOC["paths"].items():
        m = re.fullmatch(r"/([a-z][a-z-]*)", path)
        if m and "post" in ops and "get" in ops and "get" in DOC["paths"].get(f"{path}/{{id}}", {}):
            out[m.group(1)] = [(a.group(1), o["post"]) for p, o in DOC["paths"].items()
                               if (a := re.fullmatch(rf"{path}/\{{id\}}/actions/([a-z-_]+)", p))
                               and "post" in o and not o["post"].get("deprecated")
                               and "202" in o["post"]["responses"]]  # (a plan reads: test_console_plan.py)
    return out


KINDS = kinds()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevStack]:
    require_browser()
    yield from dev_stack(tmp_path_factory.mktemp("console-actions"), Z9_LB_HEALTH_INTERVAL_S="2",
                         Z9_DELETION_BUFFER_S="600")


@pytest.fixture(scope="module")
def chromium(stack: DevStack) -> Iterator[Any]:
    yield from browser()


def _accepted(stack: DevStack, status: int, out: Any) -> dict[str, Any]:
    assert status == 202, out
    for j in out.get("jobs") or [out["job"]]:
        assert stack.wait_job(j["id"], 900)["status"] == "succeeded", j
    return out


@pytest.fixture(scope="module")
def refs(stack: DevStack) -> dict[str, str]:
    """The resources the examples' ids stand for: a running server with a public address, and a
    private network (a server's attach-to-network example names one; made from its own example)."""
    out = _accepted(stack, *stack.api("POST", "servers", {
        "name": f"ref-{time.time_ns() % 10**8}", "region": "dev-1", "image": "debian-12", "cores": 1,
        "memory_mib": 1024, "disk_gib": 10, "public_ipv4": True}))
    refs = {"srv": out["server"]["id"]}
    net = _example(DOC["paths"]["/networks"]["post"])
    net = _accepted(stack, *stack.api("POST", "networks", {**net, "name": f"ref-{time.time_ns() % 10**8}"}))
    refs["net"] = net["network"]["id"]
    return refs


def _create(stack: DevStack, plural: str, refs: dict[str, str]) -> str:
    """One of the kind, from the document's own create example (a unique name; a smaller cluster)."""
    body = _example(DOC["paths"][f"/{plural}"]["post"])
    body = real_ids(body, refs)
    body["name"] = f"{body.get('name', 'x')}-{time.time_ns() % 10**8}"
    body.pop("ssh_keys", None)
    if plural == "load-balancers":
        import_lb_appliance(stack)
    if plural == "clusters":
        body["control_plane"] = {**body["control_plane"], "count": 1}
        body["node_pools"] = [{**p, "count": 1, "cores": 2, "memory_mib": 4096, "disk_gib": 30} for p in body["node_pools"]]
    out = _accepted(stack, *stack.api("POST", plural, body))
    key = next(k for k in out if k not in ("job", "jobs"))
    return out[key]["id"]


def _submit_and_watch(page: Any, click: Any) -> dict[str, Any] | None:
    """Click (a submit, an action sent at once), take the 202's job, watch it on the page to its
    end; None when the API refused it for the resource's state now (409: tried again later)."""
    with page.expect_response(lambda r: r.request.method in ("POST", "DELETE") and "/v1/" in r.url) as resp:
        click()
    r = resp.value
    if r.status == 409:
        return None
    assert r.status == 202, (r.url, r.status, r.text())
    job = r.json()["job"]
    page.wait_for_selector(f".job[data-job='{job['id']}'] .job-status[data-status=succeeded], "
                           f".job[data-job='{job['id']}'] .job-status[data-status=failed]", timeout=900_000)
    status = page.locator(f".job[data-job='{job['id']}'] .job-status").get_attribute("data-status")
    assert status == "succeeded", page.locator(f".job[data-job='{job['id']}']").inner_text()
    return job


@pytest.mark.parametrize("plural", sorted(KINDS))
def test_every_action_of_the_kind_from_its_form(plural: str, stack: DevStack, chromium: Any,
                                                refs: dict[str, str]) -> None:
    rid = _create(stack, plural, refs)
    page = new_page(chromium)
    sign_in(page, stack)
    page.goto(f"{stack.console}{plural}/{rid}")
    page.wait_for_selector("[role=group][aria-label=Actions]")
    todo = [(name, op) for name, op in KINDS[plural]]
    done: list[str] = []
    # an action not possible now (start on a running server: its button disabled; resize with more
    # memory on a running one: 409) is tried again after the others
    for _ in range(4):
        for name, op in list(todo):
            if name == "cancel-deletion":
                page.click("[data-action=delete]")
                _submit_and_watch(page, lambda: page.click("[data-action=confirm-delete]"))
            button = page.locator(f"[role=group][aria-label=Actions] [data-action='{name}']")
            button.wait_for()
            if button.is_disabled():
                continue
            body = _example(op) if op.get("requestBody") else None
            if body:  # a form: generated from the request schema, filled from the example
                button.click()
                form = page.locator("[role=group][aria-label=Actions] ~ div form")
                form.wait_for()
                assert form.locator("[name=_json]").is_hidden()  # raw JSON only behind the advanced switch
                fill_form(form, body, refs)
                job = _submit_and_watch(page, form.locator("button[type=submit]").click)
            else:
                job = _submit_and_watch(page, button.click)
            if job is None:
                continue
            done.append(name)
            todo.remove((name, op))
        if not todo:
            break
    assert not todo, f"not possible from the page: {todo}; done: {done}"
    assert "null" not in page.locator("#main").inner_text().split("\n")[:6], "a stray null under the action bar"
    # the browser logs each refused request (the 409s above, tried again later): nothing else
    errors = [e for e in page.console_errors if "status of 409" not in e]
    assert errors == [], errors
