"""`z9 dev`, the README's run command: the whole stack from nothing (embedded PostgreSQL, the
simulator, api, scheduler, executor, reaper as processes), usable with a token, stopped by
Ctrl-C, and its data kept across runs."""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import aiohttp

from tests.support import free_port


def _start(data_dir: Path, port: int) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("Z9_")}
    return subprocess.Popen([sys.executable, "-m", "z9", "dev", "--data-dir", str(data_dir), "--port", str(port),
                             "--task-seconds", "0.05"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


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
        for _ in range(400):
            async with http.get(f"{base}/jobs/{out['job']['id']}") as r:
                job = await r.json()
            if job["status"] in ("succeeded", "failed"):
                break
            await asyncio.sleep(0.05)
        assert job["status"] == "succeeded", job
        async with http.get(f"{base}/servers/{out['server']['id']}") as r:
            server = (await r.json())["server"]
        assert server["status"] == "running" and server["observed"]["vmid"]
        return server["id"]


async def test_z9_dev_runs_the_stack_and_keeps_data(tmp_path: Path) -> None:
    data_dir, port = tmp_path / ".z9", free_port()
    proc = _start(data_dir, port)
    try:
        banner = await asyncio.to_thread(_wait_banner, proc)
        assert f"http://127.0.0.1:{port}/v1" in banner
        token = (data_dir / "dev-token").read_text().strip()
        assert token in banner
        server_id = await _create_and_wait(f"http://127.0.0.1:{port}/v1", token)
    finally:
        out = await asyncio.to_thread(_stop, proc)
    assert proc.returncode == 0, out
    assert "z9 dev: stopped" in out

    # Second run: same token, same server, same VM (database and simulator state kept).
    proc = _start(data_dir, port)
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
