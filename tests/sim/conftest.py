"""Fixtures: one simulator per session, run on its own event loop in a background thread so that the
synchronous proxmoxer/requests clients can drive it from plain test functions."""

from __future__ import annotations

import asyncio
import os
import threading

import pytest
import requests
from proxmoxer import ProxmoxAPI

from z9.sim.guest import cloud_init_binary
from z9.sim.server import SimConfig, SimServer, start_simulator

from tests.support import poll_sync

TASK_SECONDS = {"qmclone": 0.25, "qmdestroy": 0.2}
GUEST_BOOT_S = 0.4
CLOUD_INIT_S = 0.4
# a real public key (PVE refuses an sshkeys line ssh-keygen cannot read)
SSH_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHJ058JkmDc3sBXLLfF+PS59IDULSD3JlYs6wRqCPjyx me@host"


class SimThread:
    def __init__(self, config: SimConfig, cert_dir):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="z9-sim")
        self.thread.start()
        self.server: SimServer = self.run(start_simulator(config, cert_dir=cert_dir))

    def run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    def close(self) -> None:
        self.run(self.server.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


@pytest.fixture(scope="session")
def sim_thread(tmp_path_factory):
    config = SimConfig(task_seconds=TASK_SECONDS, task_default_s=0.1, stats_lag_s=3600, guest_boot_s=GUEST_BOOT_S,
                       cloud_init_s=CLOUD_INIT_S, auth_delay_s=0.0,  # PVE's 3 s 401 delay: test_auth_delay
                       firewall_clock="manual")  # pve-firewall's 10 s cycle: tests step it
    st = SimThread(config, tmp_path_factory.mktemp("simcert"))
    yield st
    st.close()


@pytest.fixture
def sim(sim_thread) -> SimServer:
    """The running simulator, reset to the dev seed before each test."""
    r = requests.post(f"{sim_thread.server.admin_url}/reset", verify=False, timeout=10)
    r.raise_for_status()
    return sim_thread.server


@pytest.fixture
def pve(sim) -> ProxmoxAPI:
    return ProxmoxAPI("127.0.0.1", port=sim.port, user="root@pam", token_name="z9",
                      token_value=sim.token_secret, verify_ssl=str(sim.cert_path), timeout=10)


@pytest.fixture
def pve_at(sim):
    """pve_at("pve2"): a proxmoxer client connected to that node's own API endpoint."""
    return lambda node: ProxmoxAPI("127.0.0.1", port=sim.node_ports[node], user="root@pam", token_name="z9",
                                   token_value=sim.token_secret, verify_ssl=str(sim.cert_path), timeout=10)


@pytest.fixture
def admin(sim):
    """POST/GET/PUT/DELETE helper for the admin API: admin("post", "/faults", json={...})."""

    def call(method: str, path: str, **kw):
        r = requests.request(method, f"{sim.admin_url}{path}", verify=False, timeout=10, **kw)
        r.raise_for_status()
        return r.json()

    return call


def wait_task(pve: ProxmoxAPI, upid: str, timeout: float = 10.0) -> dict:
    node = upid.split(":")[1]

    def stopped() -> dict | None:
        st = pve.nodes(node).tasks(upid).status.get()
        return st if st["status"] == "stopped" else None
    return poll_sync(stopped, timeout, f"task {upid} to stop", interval_s=0.02)


@pytest.fixture
def wait(pve):
    """wait(upid) -> the stopped task's status dict."""
    return lambda upid, timeout=10.0: wait_task(pve, upid, timeout)


@pytest.fixture
def sim_thread_factory():
    """SimThread(config, cert_dir) for tests that need their own simulator."""
    return SimThread


@pytest.fixture
def cloud_init_tool() -> str:
    """Debian's cloud-init: skipped without it, a failure under Z9_REQUIRE_GUEST_TOOLS=1 (CI)."""
    path = cloud_init_binary()
    if path is None:
        if os.environ.get("Z9_REQUIRE_GUEST_TOOLS") == "1":
            pytest.fail("cloud-init is not installed (Z9_REQUIRE_GUEST_TOOLS=1): apt-get install cloud-init")
        pytest.skip("cloud-init is not installed")
    return path
