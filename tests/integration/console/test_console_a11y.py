"""The web console's accessibility in a real browser: axe-core (tools/axe-core, pinned, installed
by `npm ci`) over every page, light and dark, desktop and phone-sized: no serious or critical
violation. And the screenshot script (tools/console_screenshots.py) makes its pictures."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.integration.console.console_support import AXE, DevStack, browser, dev_stack, new_page, require_browser, sign_in
from tools import console_screenshots as shots

pytestmark = pytest.mark.timeout(1200)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevStack]:
    require_browser()
    if not AXE.exists():
        if os.environ.get("Z9_REQUIRE_BROWSER") == "1":
            pytest.fail(f"axe-core missing: (cd tools/axe-core && npm ci) ({AXE})")
        pytest.skip("axe-core missing: (cd tools/axe-core && npm ci)")
    yield from dev_stack(tmp_path_factory.mktemp("console-a11y"))


@pytest.fixture(scope="module")
def chromium(stack: DevStack) -> Iterator[Any]:
    yield from browser()


@pytest.fixture(scope="module")
def seeded(stack: DevStack) -> tuple[dict[str, str], str]:
    return shots.seed(stack), stack.token_for("dev", "read", "write", "operator")


def _axe(page: Any) -> list[dict[str, Any]]:
    page.add_script_tag(path=str(AXE))
    result = page.evaluate("async () => await axe.run(document, {resultTypes: ['violations']})")
    return [{"id": v["id"], "impact": v["impact"], "help": v["help"],
             "nodes": [n["target"] for n in v["nodes"]][:5]}
            for v in result["violations"] if v["impact"] in ("serious", "critical")]


@pytest.mark.parametrize("scheme,viewport", [("light", {"width": 1280, "height": 860}),
                                             ("dark", {"width": 390, "height": 844})])
def test_every_page_has_no_serious_axe_violation(stack: DevStack, chromium: Any, seeded: Any, scheme: str,
                                                 viewport: dict[str, int]) -> None:
    ids, op = seeded
    # axe-core is injected by the test (add_script_tag bypasses the page's CSP through the devtools protocol)
    page = new_page(chromium, color_scheme=scheme, viewport=viewport, bypass_csp=True)
    page.goto(stack.console)
    page.wait_for_selector("#token")
    found = {"sign-in": _axe(page)}
    sign_in(page, stack, op)
    for name, path in shots.pages(ids):
        page.goto(stack.console + path)
        shots.settle(page)
        found[name] = _axe(page)
    bad = {k: v for k, v in found.items() if v}
    assert not bad, bad
    assert page.console_errors == [], page.console_errors


def test_the_screenshot_script_makes_its_pictures(stack: DevStack, chromium: Any, seeded: Any, tmp_path: Path) -> None:
    ids, op = seeded
    made = shots.shoot(stack, chromium, tmp_path, ids, op)
    assert len(made) >= 20 and all(p.stat().st_size > 5000 for p in made)
    committed = {p.name for p in (Path(__file__).resolve().parents[3] / "docs" / "console").glob("*.png")}
    assert {p.name for p in made} <= committed, "docs/console is stale: run .venv/bin/python tools/console_screenshots.py"
