"""`z9 dev`, the README's run command: the whole stack from nothing (embedded PostgreSQL, the
simulator, api, scheduler, executor, reaper as processes), usable with a token, stopped by
Ctrl-C, and its data kept across runs."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import aiohttp

from tests.support import free_port, free_ports, poll_sync, wait_until


def _metrics_base() -> int:
    """A port p with p … p+3 free (z9 dev's scheduler, executor, reaper and api metrics)."""
    return free_ports(4)


def _start(data_dir: Path, port: int, metrics_base: int) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("Z9_")}
    return subprocess.Popen([sys.executable, "-m", "z9", "dev", "--data-dir", str(data_dir), "--port", str(port),
                             "--metrics-port", str(metrics_base), "--task-seconds", "0.05"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


async def _check_metrics(data_dir: Path, banner: str) -> None:
    """The Prometheus file_sd target file lists every service, each serving z9 metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    groups = json.loads((data_dir / "prometheus-targets.json").read_text())
    assert sorted(g["labels"]["service"] for g in groups) == ["api", "executor", "reaper", "scheduler"]
    expect = {"api": "z9_http_requests_total", "scheduler": "z9_jobs", "executor": "z9_job_attempts_total",
              "reaper": "z9_deletion_buffer_expiries_total"}
    async with aiohttp.ClientSession() as http:
        for g in groups:
            (target,) = g["targets"]
            url = f"http://{target}/metrics"
            assert url in banner
            async with http.get(url) as r:
                assert r.status == 200
                names = {s.name for f in text_string_to_metric_families(await r.text()) for s in f.samples}
            assert expect[g["labels"]["service"]] in names, (g, sorted(names))


def _wait_banner(proc: subprocess.Popen, timeout_s: float = 90) -> str:
    deadline, seen = time.monotonic() + timeout_s, []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            break
        seen.append(line)
        if "Ctrl-C stops everything" in line:
            return "".join(seen)
    raise AssertionError("z9 dev did not come up:\n" + "".join(seen))


def _stop(proc: subprocess.Popen) -> str:
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    return out


async def _create_and_wait(base: str, token: str) -> str:
    headers = {"Authorization": f"Bearer {token}"}
    async with aiohttp.ClientSession(headers=headers) as http:
        body = {"name": "dev-web", "region": "dev-1", "image": "debian-12", "cores": 1, "memory_mib": 1024,
                "disk_gib": 4}
        async with http.post(f"{base}/servers", json=body) as r:
            assert r.status == 202, await r.text()
            out = await r.json()
        async def finished() -> dict | None:
            async with http.get(f"{base}/jobs/{out['job']['id']}") as r:
                job = await r.json()
            return job if job["status"] in ("succeeded", "failed") else None
        job = await wait_until(finished, 30, "the create to finish")
        assert job["status"] == "succeeded", job
        async with http.get(f"{base}/servers/{out['server']['id']}") as r:
            server = (await r.json())["server"]
        assert server["status"] == "running" and server["observed"]["vmid"]
        return server["id"]


async def test_z9_dev_runs_the_stack_and_keeps_data(tmp_path: Path) -> None:
    data_dir, port, metrics_base = tmp_path / ".z9", free_port(), _metrics_base()
    proc = _start(data_dir, port, metrics_base)
    try:
        banner = await asyncio.to_thread(_wait_banner, proc)
        assert f"http://127.0.0.1:{port}/v1" in banner
        token = (data_dir / "dev-token").read_text().strip()
        assert token in banner
        server_id = await _create_and_wait(f"http://127.0.0.1:{port}/v1", token)
        # the simulated cluster's datacenter firewall is on: without it no IP filter z9 sets is enforced
        assert _datacenter_firewall(data_dir) == "1"
        await _check_metrics(data_dir, banner)
        async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{port}/metrics") as r:
            assert r.status == 404  # the API's metrics are on their own listener, not the tenants' port
        _check_service_secrets(proc.pid, data_dir)
    finally:
        out = await asyncio.to_thread(_stop, proc)
    assert proc.returncode == 0, out
    assert "z9 dev: stopped" in out
    for name in ("dev-token", "sim-secret", "installation-key", "database-url", "sim-state.json", "sim/key.pem"):
        path = data_dir / name
        if path.exists():
            assert path.stat().st_mode & 0o077 == 0, f"{name} is readable by others: {oct(path.stat().st_mode)}"
    assert (data_dir / "sim-state.json").exists() and (data_dir / "dev-token").exists()

    # Second run: same token, same server, same VM (database and simulator state kept).
    proc = _start(data_dir, port, metrics_base)
    try:
        await asyncio.to_thread(_wait_banner, proc)
        assert (data_dir / "dev-token").read_text().strip() == token
        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {token}"}) as http:
            async with http.get(f"http://127.0.0.1:{port}/v1/servers/{server_id}") as r:
                assert r.status == 200
                assert (await r.json())["server"]["status"] == "running"
    finally:
        await asyncio.to_thread(_stop, proc)
    assert proc.returncode == 0


def _datacenter_firewall(data_dir: Path) -> str:
    """The simulated cluster's ``enable`` of ``GET /cluster/firewall/options``, asked as any PVE client."""
    import ssl
    import urllib.request

    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    sim = (data_dir / "sim-url").read_text().strip()
    secret = (data_dir / "sim-secret").read_text().strip()
    req = urllib.request.Request(f"{sim}/api2/json/cluster/firewall/options",
                                 headers={"Authorization": f"PVEAPIToken=root@pam!z9={secret}"})
    with urllib.request.urlopen(req, timeout=30, context=ctx) as r:
        return str((json.loads(r.read()).get("data") or {}).get("enable", "0"))


def _check_service_secrets(dev_pid: int, data_dir: Path) -> None:
    """Each service process has only the secrets it uses in its environment (docs/settings.md):
    the Proxmox token secret the executor, the api and the reaper (they read the region: a plan, the
    periodic drift check), the installation key the api and the executor."""
    pve_secret = (data_dir / "sim-secret").read_text().strip()
    key = (data_dir / "installation-key").read_text().strip()
    seen = {}
    for pid in _children(dev_pid):
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        service = argv[3].decode() if len(argv) > 3 else ""
        environ = Path(f"/proc/{pid}/environ").read_bytes()
        seen[service] = (pve_secret.encode() in environ, key.encode() in environ)
    assert seen.get("api") == (True, True), seen
    assert seen.get("executor") == (True, True), seen
    assert seen.get("scheduler") == (False, False), seen
    assert seen.get("reaper") == (True, False), seen


def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    return [int(p) for p in out]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"  # a zombie has exited


def _services_of(pid: int) -> list[int]:
    """The service processes ``z9 dev`` (``pid``) started: its children running ``-m z9 <service>``
    (not its database's watchdog, which by design outlives it until the database is stopped)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            argv = (stat.parent / "cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError, IndexError):
            continue
        if ppid == pid and b"-m" in argv and argv[argv.index(b"-m") + 1:argv.index(b"-m") + 2] == [b"z9"]:
            found.append(int(stat.parent.name))
    return found


def _wait_gone(pids: list[int], timeout_s: float = 40) -> list[int]:
    """The pids still alive after ``timeout_s`` (none: all gone)."""
    try:
        poll_sync(lambda: not any(_alive(p) for p in pids), timeout_s, f"pids {pids} to exit", interval_s=0.1)
    except AssertionError:
        pass
    return [p for p in pids if _alive(p)]


def _start_on(db_url: str, data_dir: Path, port: int, metrics_base: int) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("Z9_")}
    env["Z9_DATABASE_URL"] = db_url
    return subprocess.Popen([sys.executable, "-m", "z9", "dev", "--data-dir", str(data_dir), "--port", str(port),
                             "--metrics-port", str(metrics_base), "--task-seconds", "0.05"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


async def test_z9_dev_is_alone_on_its_data_dir_hides_the_secret_and_its_children_never_outlive_it(
        tmp_path: Path, db_url: str) -> None:
    data_dir = tmp_path / ".z9"
    port, metrics_base = free_port(), _metrics_base()
    proc = _start_on(db_url, data_dir, port, metrics_base)
    try:
        await asyncio.to_thread(_wait_banner, proc)
        kids = _children(proc.pid)
        assert len(kids) == 5, kids  # sim, api, scheduler, executor, reaper
        # The simulator's token secret is on no command line, and not in the output.
        secret = (data_dir / "sim-secret").read_text().strip()
        for pid in kids:
            assert secret not in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"), pid
        # A second z9 dev on the same data directory refuses at once.
        other = subprocess.run([sys.executable, "-m", "z9", "dev", "--data-dir", str(data_dir), "--port",
                                str(free_port()), "--metrics-port", str(_metrics_base())],
                               env={k: v for k, v in os.environ.items() if not k.startswith("Z9_")},
                               capture_output=True, text=True, timeout=60)
        assert other.returncode == 2, other
        assert f"another z9 dev (pid {proc.pid}) is running on {data_dir.resolve()}" in other.stderr, other.stderr
        # Its output closed (`z9 dev | head`), then Ctrl-C: the shutdown still runs.
        proc.stdout.close()
        proc.send_signal(signal.SIGINT)
        await asyncio.to_thread(proc.wait, 60)
        assert await asyncio.to_thread(_wait_gone, kids) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert secret not in Path(data_dir / "dev-token").read_text()

    # Killed outright (SIGKILL: no finally runs): the children are told to stop by the kernel.
    proc = _start_on(db_url, data_dir, port, metrics_base)
    try:
        banner = await asyncio.to_thread(_wait_banner, proc)
        assert secret not in banner
        kids = _children(proc.pid)
        assert len(kids) == 5, kids
        proc.kill()
        proc.wait()
        assert await asyncio.to_thread(_wait_gone, kids) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
