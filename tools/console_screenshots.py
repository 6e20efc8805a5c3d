"""Screenshots of the web console's main pages into docs/console/ (light and dark, desktop and a
phone): starts its own `z9 dev` (in a temporary directory), makes a server, an address and a job
to show, and drives Debian's chromium through Playwright (``executable_path``; no browser
download).

    .venv/bin/python tools/console_screenshots.py [--out docs/console]

The browser tests (tests/integration/console/test_console_a11y.py) walk the same pages with axe-core."""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.integration.console.console_support import DevStack, browser, dev_stack, new_page, sign_in  # noqa: E402


def seed(stack: DevStack) -> dict[str, str]:
    """A server (running), a floating address on it and their jobs: something on every page."""
    status, out = stack.api("POST", "servers", {"name": f"web-{time.time_ns() % 10**6}", "region": "dev-1",
                                                "image": "debian-12", "cores": 2, "memory_mib": 2048, "disk_gib": 20})
    assert status == 202, out
    job = stack.wait_job(out["job"]["id"])
    server = out["server"]["id"]
    assert stack.api("PATCH", f"servers/{server}", {"labels": {"env": "prod", "tier": "web"}})[0] == 200
    status, adr = stack.api("POST", "addresses", {"region": "dev-1", "name": f"www-{time.time_ns() % 10**6}",
                                                  "server_id": server})
    assert status == 202, adr
    stack.wait_job(adr["job"]["id"])
    # and a job retrying in the region (the simulator refuses every clone), for the operator's view
    stack.sim("POST", "/faults", {"method": "POST", "path": ".*/clone$", "action": "error", "status": 503,
                                  "reason": "Service Unavailable", "probability": 1.0})
    status, stuck = stack.api("POST", "servers", {"name": f"stuck-{time.time_ns() % 10**6}", "region": "dev-1",
                                                  "image": "debian-12", "cores": 1, "memory_mib": 1024, "disk_gib": 10})
    assert status == 202, stuck
    deadline = time.monotonic() + 300
    while stack.api("GET", f"jobs/{stuck['job']['id']}?wait_s=5")[1].get("status") != "retry":
        assert time.monotonic() < deadline, "the stuck job never retried"
    return {"server": server, "job": job["id"], "address": adr["address"]["id"], "stuck": stuck["server"]["id"],
            "stuck_job": stuck["job"]["id"]}


def pages(ids: dict[str, str]) -> list[tuple[str, str]]:
    """(file name, console path) of every page shown."""
    return [("overview", ""), ("servers", "servers"), ("server-create", "servers/new"),
            ("server", f"servers/{ids['server']}"), ("addresses", "addresses"), ("address", f"addresses/{ids['address']}"),
            ("load-balancers", "load-balancers"), ("load-balancer-create", "load-balancers/new"),
            ("clusters", "clusters"), ("cluster-create", "clusters/new"), ("jobs", "jobs"), ("job", f"jobs/{ids['job']}"),
            ("tokens", "tokens"), ("quota", "quota"), ("operator", "operator"),
            ("operator-job", f"operator/jobs/{ids['stuck_job']}"), ("retrying", f"servers/{ids['stuck']}")]


def settle(page: Any) -> None:
    """The page has drawn what it loads (its 'Loading…' placeholders gone)."""
    from playwright.sync_api import expect

    page.wait_for_selector("main h1")
    # (a locator, not wait_for_function: the console's CSP forbids evaluating strings)
    expect(page.locator("main").get_by_text("Loading")).to_have_count(0, timeout=120_000)


def shoot(stack: DevStack, b: Any, out: Path, ids: dict[str, str], operator_token: str) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    made = []
    for scheme in ("light", "dark"):
        page = new_page(b, color_scheme=scheme, viewport={"width": 1280, "height": 860})
        page.goto(stack.console)
        page.wait_for_selector("#token")
        made.append(out / f"sign-in-{scheme}.png")
        page.screenshot(path=str(made[-1]))
        sign_in(page, stack, operator_token)
        for name, path in pages(ids):
            if scheme == "dark" and name not in ("overview", "server", "job", "operator"):
                continue
            page.goto(stack.console + path)
            settle(page)
            if name in ("server", "address", "retrying", "job", "operator-job"):
                page.wait_for_selector(".job .job-status")  # its job panel drawn (not "Loading the job…")
            if name in ("server", "address", "retrying"):
                page.wait_for_selector("#main > div > p .readiness")  # ready, or not ready and why
            if name == "load-balancer-create":  # a row of each list: a service (its health check), a target
                page.click("[data-add=services]")
                page.select_option("select[name='services[0].health_check.protocol']", "tcp")
                page.click("[data-add=targets]")
                page.wait_for_selector("select[name='targets[0].server_id'][data-state=ready]")
            made.append(out / f"{name}-{scheme}.png")
            page.screenshot(path=str(made[-1]), full_page=True)
        page.context.close()
    phone = new_page(b, viewport={"width": 390, "height": 844}, device_scale_factor=1, is_mobile=True)
    sign_in(phone, stack, operator_token)
    for name, path in (("servers", "servers"), ("server", f"servers/{ids['server']}")):
        phone.goto(stack.console + path)
        settle(phone)
        if name == "server":
            phone.wait_for_selector("#main > div > p .readiness")
        made.append(out / f"{name}-phone.png")
        phone.screenshot(path=str(made[-1]), full_page=True)
    return made


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "console")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        stacks = dev_stack(Path(tmp))
        stack = next(stacks)
        try:
            ids = seed(stack)
            # the operator's view too: the dev tenant's token with operator added
            op = stack.token_for("dev", "read", "write", "operator")
            for b in browser():
                for p in shoot(stack, b, args.out, ids, op):
                    print(p.relative_to(ROOT) if p.is_relative_to(ROOT) else p)
        finally:
            stacks.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
