"""A worker whose guest boots slower than a join token lives: kubeadm's discovery refuses the expired token
("could not find a JWS signature … for token ID"), the job mints a new one and reboots the member — and that
token's life now follows the boot time z9 measured (the first boot's, from the start to the refusal), so the
second boot joins. Before, every re-mint got the same ``cluster_join_token_ttl_s``, each reboot outlived it
again, and after MAX_REJOINS the cluster failed for good (kubernetes-sigs/cluster-api#2770's class). The
issue's 45 s boot and 30 s token, scaled to a 3 s boot and a 2 s token: the simulator holds z9 to the ttl
it gives ``kubeadm token create --ttl`` on its own clock (simulator/z9/sim/kubeadm.py)."""
from __future__ import annotations

import pytest

from tests.integration.clusters.test_clusters_e2e import body
from tests.support import SimAdmin, Stack


@pytest.mark.settings(cluster_join_token_ttl_s=2.0)
async def test_a_worker_booting_slower_than_its_token_lives_joins(stack: Stack, sim: SimAdmin) -> None:
    await sim.configure(guest_boot_s=3.0, cloud_init_s=0.2, k8s_api_delay_s=0.3)
    status, out = await stack.call("POST", "/clusters", json=body("slow-boot", cps=1, workers=1))
    assert status == 202, out
    done = await stack.wait_job(out["job"]["id"], timeout_s=240)
    assert done["status"] == "succeeded", done.get("error")
    status, got = await stack.call("GET", f"/clusters/{out['cluster']['id']}")
    assert got["cluster"]["status"] == "running", got
