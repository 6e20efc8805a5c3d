"""Clusters next to the features merged beside them (issue 11 with 12/14): an immediate delete
supersedes the cluster's waiting jobs at once and cannot be cancelled or re-run; quotas count the
members' cores and memory and the endpoint address; labels at create, PATCH and label_selector."""
from __future__ import annotations

from typing import Any

import pytest

from z9.common import store

from tests.support import REGION, SimAdmin, Stack


def body(name: str = "prod", cps: int = 1, workers: int = 2, **over: Any) -> dict[str, Any]:
    return {"name": name, "region": REGION, "version": "1.33",
            "control_plane": {"count": cps, "cores": 2, "memory_mib": 4096, "disk_gib": 30},
            "node_pools": [{"name": "workers", "count": workers, "cores": 2, "memory_mib": 2048, "disk_gib": 20}],
            **over}


# "DELETE enqueues the delete at once … so the delete does not wait behind a create": a create
# that has not run yet (or waits in its backoff) ends at once, cancelled, naming the delete job.
# The delete itself has no cancel, and neither it nor the superseded create can be re-run.
async def test_delete_supersedes_a_waiting_create_at_once_and_has_no_cancel(stack: Stack, sim: SimAdmin) -> None:
    await stack.stop_service("executor")
    status, out = await stack.call("POST", "/clusters", json=body(cps=1, workers=0))
    assert status == 202, out
    cid, create_job = out["cluster"]["id"], out["job"]["id"]
    status, out = await stack.call("DELETE", f"/clusters/{cid}")
    assert status == 202 and out["cluster"]["status"] == "destroying", out
    delete_job = out["job"]["id"]
    created = await stack.job(create_job)
    assert created["status"] == "failed" and created["error"]["class"] == "cancelled", created
    assert delete_job in created["error"]["message"] and "ClusterDelete" in created["error"]["message"]

    status, out = await stack.call("POST", f"/jobs/{delete_job}/actions/cancel")
    assert status == 409 and out["error"]["code"] == "job_not_cancellable", out
    status, out = await stack.call("POST", f"/jobs/{create_job}/actions/rerun")
    assert status == 409 and out["error"]["code"] == "resource_deleting", out

    await stack.start_service("executor")
    done = await stack.wait_job(delete_job, timeout_s=60)
    assert done["status"] == "succeeded", done
    status, out = await stack.call("GET", f"/clusters/{cid}")
    assert out["cluster"]["status"] == "deleted"
    assert await stack.pool.fetchval("SELECT count(*) FROM cluster_keys WHERE cluster_id = $1", cid) == 0
    status, out = await stack.call("POST", f"/jobs/{delete_job}/actions/cancel")
    assert status == 409 and out["error"]["code"] in ("job_not_cancellable", "job_finished"), out


# Quotas: a cluster's members are the tenant's VMs — their cores and memory count (create, and
# a pool added or grown; a shrink always passes); the endpoint is one address; servers: not counted.
async def test_quotas_count_members_cores_memory_and_the_endpoint(api: Stack) -> None:
    await store.tenant_quota_set(api.pool, api.tenant_id, {"cores": 10, "servers": 0})
    status, out = await api.call("POST", "/clusters", json=body(name="big", cps=3, workers=3))  # 12 cores
    assert status == 403 and out["error"]["code"] == "quota_exceeded", out
    assert out["error"]["details"] == [{"limit": "cores", "quota": 10, "used": 0, "requested": 12}]
    status, out = await api.call("POST", "/clusters", json=body(name="ok", cps=1, workers=3))  # 8 cores
    assert status == 202, out  # a servers quota of 0 does not stop a cluster: members are not servers
    cid = out["cluster"]["id"]
    assert await api.pool.fetchval("SELECT count(*) FROM clusters WHERE tenant_id = $1", api.tenant_id) == 1

    status, out = await api.call("POST", f"/clusters/{cid}/actions/resize-node-pool", json={"pool": "workers", "count": 5})
    assert status == 403 and out["error"]["details"] == [{"limit": "cores", "quota": 10, "used": 8, "requested": 4}]
    status, out = await api.call("POST", f"/clusters/{cid}/actions/add-node-pool",
                                 json={"name": "gpu", "count": 1, "cores": 4, "memory_mib": 4096})
    assert status == 403 and out["error"]["details"][0]["limit"] == "cores", out
    status, out = await api.call("POST", f"/clusters/{cid}/actions/resize-node-pool", json={"pool": "workers", "count": 4})
    assert status == 202, out  # 10 cores: exactly the quota

    # a server now finds the quota taken by the cluster's members
    await store.tenant_quota_set(api.pool, api.tenant_id, {"servers": None, "cores": None, "memory_mib": 4096 + 4 * 2048})
    status, out = await api.call("POST", "/servers", json={"name": "s", "region": REGION, "image": "debian-12",
                                                           "cores": 1, "memory_mib": 1024, "disk_gib": 10})
    assert status == 403 and out["error"]["details"] == [{"limit": "memory_mib", "quota": 12288, "used": 12288,
                                                         "requested": 1024}], out
    status, out = await api.call("POST", f"/clusters/{cid}/actions/resize-node-pool", json={"pool": "workers", "count": 0})
    assert status == 202, out  # shrinking is always allowed

    # the endpoint address counts against the addresses quota
    used = await api.pool.fetchval("SELECT count(*) FROM addresses WHERE tenant_id = $1 AND status <> 'deleted'",
                                   api.tenant_id)
    await store.tenant_quota_set(api.pool, api.tenant_id, {"memory_mib": None, "addresses": used})
    status, out = await api.call("POST", "/clusters", json=body(name="third", workers=0))
    assert status == 403 and out["error"]["details"][0]["limit"] == "addresses", out


async def test_labels_at_create_patch_and_label_selector(api: Stack) -> None:
    status, out = await api.call("POST", "/clusters", json=body(name="a", labels={"env": "prod", "team": "web"}))
    assert status == 202 and out["cluster"]["labels"] == {"env": "prod", "team": "web"}, out
    a = out["cluster"]["id"]
    status, out = await api.call("POST", "/clusters", json=body(name="b", labels={"env": "dev"}))
    b = out["cluster"]["id"]
    status, out = await api.call("POST", "/clusters", json=body(name="c", labels={"env": "Not ok!"}))
    assert status == 422 and "labels" in out["error"]["message"], out

    async def ids(selector: str) -> list[str]:
        status, out = await api.call("GET", "/clusters", params={"label_selector": selector})
        assert status == 200, out
        return [c["id"] for c in out["clusters"]]

    assert await ids("env=prod") == [a]
    assert await ids("env in (prod,dev)") == sorted([a, b])
    assert await ids("!team") == [b]

    status, out = await api.call("PATCH", f"/clusters/{b}", json={"labels": {"env": "prod", "tier": "2"}})
    assert status == 200 and out["cluster"]["labels"] == {"env": "prod", "tier": "2"}, out
    assert await ids("env=prod") == sorted([a, b])
    status, out = await api.call("PATCH", f"/clusters/{b}", json={"name": "x"})
    assert status == 422, out
    status, out = await api.call("PATCH", "/clusters/k8s_01jd3x5v8q2m6n4p7r9s1t3w5y", json={"labels": {}})
    assert status == 404, out


# A cancelled node-pool change leaves no cluster "updating" for ever: degraded once it was whole
# (failed before), unless another job of the cluster is live to move it on.
async def test_cancelled_reconcile_settles_the_cluster(api: Stack) -> None:
    status, out = await api.call("POST", "/clusters", json=body(name="c1"))
    cid, create_job = out["cluster"]["id"], out["job"]["id"]
    status, out = await api.call("POST", f"/jobs/{create_job}/actions/cancel")
    assert status == 200 and out["job"]["error"]["class"] == "cancelled", out
    status, out = await api.call("GET", f"/clusters/{cid}")
    assert out["cluster"]["status"] == "failed", out  # a create cancelled: the generic rule

    await api.pool.execute("UPDATE clusters SET status = 'running', initialized_at = now() WHERE id = $1", cid)
    jobs = []
    for n in (3, 4):
        status, out = await api.call("POST", f"/clusters/{cid}/actions/resize-node-pool",
                                     json={"pool": "workers", "count": n})
        assert status == 202, out
        jobs.append(out["job"]["id"])
    status, out = await api.call("POST", f"/jobs/{jobs[0]}/actions/cancel")
    assert status == 200, out
    status, out = await api.call("GET", f"/clusters/{cid}")
    assert out["cluster"]["status"] == "updating"  # the second reconcile will move it on
    status, out = await api.call("POST", f"/jobs/{jobs[1]}/actions/cancel")
    assert status == 200, out
    status, out = await api.call("GET", f"/clusters/{cid}")
    c = out["cluster"]
    assert c["status"] == "degraded" and jobs[1] in c["status_reason"] and "resize again" in c["status_reason"], c
    status, out = await api.call("POST", f"/jobs/{jobs[1]}/actions/rerun")
    assert status == 202 and out["job"]["kind"] == "ClusterReconcile", out


# kubeadm's preflight on a control plane (init and control-plane join; checks.go InitNodeChecks):
# ControlPlaneNumCPU = 2 CPUs, ControlPlaneMem = 1700 MB of the guest kernel's RAM
# (cmd/kubeadm/app/constants/constants.go). z9 passes no --ignore-preflight-errors, so a smaller
# control plane would never become a cluster: the API refuses it, naming the field and the minimum.
async def test_a_control_plane_kubeadm_would_refuse_is_refused(api: Stack) -> None:
    for shape, field, words in (({"cores": 1}, "control_plane.cores", ("2", "ControlPlaneNumCPU")),
                                ({"memory_mib": 1024}, "control_plane.memory_mib", ("1700", "ControlPlaneMem", "2048")),
                                ({"memory_mib": 1792}, "control_plane.memory_mib", ("1700", "2048"))):
        b = body(name="small", cps=1, workers=0)
        b["control_plane"].update(shape)
        status, out = await api.call("POST", "/clusters", json=b)
        assert status == 422, out
        fields = {d["field"]: d["message"] for d in out["error"]["details"]}
        assert list(fields) == [field], out
        for w in words:
            assert w in fields[field], out
        assert "kubeadm" in fields[field], out
    # workers have no such preflight (JoinNodeChecks): 1 core and 1024 MiB are accepted
    b = body(name="small", cps=1, workers=1)
    b["control_plane"].update(cores=2, memory_mib=2048)
    b["node_pools"][0].update(cores=1, memory_mib=1024)
    status, out = await api.call("POST", "/clusters", json=b)
    assert status == 202, out
    # the OpenAPI document carries the minimums (the console and the schemathesis run read them)
    status, doc = await api.call("GET", "/openapi.json")
    cp = doc["components"]["schemas"]["ControlPlaneSpec"]["properties"]
    assert cp["cores"]["minimum"] == 2 and cp["memory_mib"]["minimum"] == 2048, cp


# The image carries the Kubernetes the cluster asks for (kubeadm deploys a control plane of its own
# minor or one behind, MinimumControlPlaneVersion in cmd/kubeadm/app/constants/constants.go, and its
# preflight refuses a kubelet newer than the control plane, KubeletVersionCheck in
# cmd/kubeadm/app/preflight/checks.go): the version picks the region's image of that minor, a named
# image must carry it, and a version no image carries is refused — not failed later by cloud-init.
@pytest.mark.settings(region={"kubernetes_images": {"debian-12-k8s-1.32": "1.32.9", "debian-12-k8s-1.33": "1.33.5"},
                              "images": ["debian-12", "debian-12-k8s-1.32", "debian-12-k8s-1.33"]})
async def test_the_version_picks_an_image_that_carries_it_or_is_refused(api: Stack) -> None:
    status, out = await api.call("POST", "/clusters", json=body(name="v31", version="1.31"))
    assert status == 422, out
    assert [d["field"] for d in out["error"]["details"]] == ["version"], out
    assert "1.31" in out["error"]["message"] and "1.32.9 (debian-12-k8s-1.32)" in out["error"]["message"], out
    for image, carried in (("debian-12-k8s-1.33", "1.33.5"), ("debian-12", None)):
        status, out = await api.call("POST", "/clusters", json=body(name="named", version="1.32", image=image))
        assert status == 422, out
        assert [d["field"] for d in out["error"]["details"]] == ["image"], out
        assert (carried or "kubernetes_images") in out["error"]["message"], out
    status, out = await api.call("POST", "/clusters", json=body(name="v32", version="1.32"))
    assert status == 202 and out["cluster"]["image"] == "debian-12-k8s-1.32", out
    status, out = await api.call("POST", "/clusters", json=body(name="v33", version="1.33", image="debian-12-k8s-1.33"))
    assert status == 202 and out["cluster"]["image"] == "debian-12-k8s-1.33", out
    status, out = await api.call("GET", "/images")
    assert status == 200 and {i["name"]: i["kubernetes"] for i in out["images"]} == {
        "debian-12": None, "debian-12-k8s-1.32": "1.32.9", "debian-12-k8s-1.33": "1.33.5"}, out
