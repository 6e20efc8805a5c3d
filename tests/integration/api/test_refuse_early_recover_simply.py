"""What the API can know is impossible is refused at the request; a failed resource is fixed or
deleted without waiting a buffer.

- A disk smaller than the image's (the region's ``image_disk_gib``) is a 422 naming ``disk_gib``,
  not a 202 whose job fails (disks cannot shrink).
- A failed create's DELETE is immediate (no buffer: straight to the final job) and the name is
  free once the resource is ``deleted``.
- A re-run takes the resource's current intent (a failed server renamed since is created under
  its new name), not the old request's; a resize of a failed create is its create at the new size
  (there is no VM to resize).
- A name held by a resource in its deletion buffer: the 409 says when it is free and how to free
  it now (rename the deleting one), and that works.
"""
from __future__ import annotations

import pytest

from tests.support import REGION, SimAdmin, Stack

BODY = {"name": "web-1", "region": REGION, "image": "debian-12", "cores": 1, "memory_mib": 1024, "disk_gib": 10}


# the simulator's debian-12 template disk size (2 GiB, simulator/z9/sim/server.py), configured as
# z9 dev configures it
@pytest.mark.settings(region={"image_disk_gib": {"debian-12": 2}})
async def test_a_disk_smaller_than_the_image_is_422_at_the_request(api: Stack) -> None:
    status, out = await api.call("POST", "/servers", json={**BODY, "disk_gib": 1})
    assert status == 422, out
    assert out["error"]["code"] == "validation_failed" and "disk_gib" in out["error"]["message"], out
    assert out["error"]["details"] == [{"field": "disk_gib", "message": "at least 2 (the image's disk)"}], out
    assert await api.pool.fetchval("SELECT count(*) FROM servers") == 0
    assert await api.pool.fetchval("SELECT count(*) FROM jobs") == 0
    status, out = await api.call("POST", "/servers", json={**BODY, "disk_gib": 2})
    assert status == 202, out
    status, out = await api.call("GET", "/images")
    assert status == 200 and out["images"][0] == {"name": "debian-12", "regions": [REGION], "disk_gib": 2,
                                                  "kubernetes": None}, out


async def _failed_create(stack: Stack, sim: SimAdmin, name: str, **over: object) -> dict:
    sim.allow_rejections = True
    await sim.fault(method="POST", path=r"/clone$", action="error", status=400,
                    reason="Parameter verification failed.", times=1)
    server, job = await stack.create_server(name, **over)
    assert (await stack.wait_job(job["id"], timeout_s=60))["status"] == "failed"
    server = await stack.server(server["id"])
    assert server["status"] == "failed", server
    return server


async def test_a_failed_create_is_deleted_at_once_and_its_name_is_free(stack: Stack, sim: SimAdmin) -> None:
    server = await _failed_create(stack, sim, "doomed")
    status, out = await stack.call("DELETE", f"/servers/{server['id']}")
    assert status == 202, out
    # no buffer: straight to the final job
    assert out["server"]["status"] == "destroying" and out["server"]["delete_after"] is None, out
    assert out["job"]["kind"] == "ServerDelete", out
    assert (await stack.wait_job(out["job"]["id"], timeout_s=60))["status"] == "succeeded"
    assert (await stack.server(server["id"]))["status"] == "deleted"
    again, job = await stack.create_server("doomed")
    assert (await stack.wait_job(job["id"], timeout_s=60))["status"] == "succeeded"
    # a server that was created (its create succeeded) keeps its buffer when it later fails
    await stack.pool.execute("UPDATE servers SET status = 'failed', status_reason = 'x' WHERE id = $1", again["id"])
    status, out = await stack.call("DELETE", f"/servers/{again['id']}")
    assert status == 202 and out["server"]["status"] == "deleting" and out["job"]["kind"] == "ServerStop", out


async def test_a_rerun_takes_the_current_intent(stack: Stack, sim: SimAdmin) -> None:
    server = await _failed_create(stack, sim, "fixme")
    first = (await stack.call("GET", f"/jobs?resource_id={server['id']}"))[1]["jobs"][0]
    # the intent changes after the failure (renamed): the re-run builds what the row says now
    status, out = await stack.call("PATCH", f"/servers/{server['id']}", json={"name": "fixed"})
    assert status == 200, out
    status, out = await stack.call("POST", f"/jobs/{first['id']}/actions/rerun")
    assert status == 202, out
    assert (await stack.wait_job(out["job"]["id"], timeout_s=60))["status"] == "succeeded"
    got = await stack.server(server["id"])
    assert got["status"] == "running" and got["name"] == "fixed", got
    vm = await sim.vm(got["observed"]["vmid"])
    assert vm["config"]["name"] == "fixed", vm["config"]


async def test_a_resize_of_a_failed_create_is_its_create_at_the_new_size(stack: Stack, sim: SimAdmin) -> None:
    """A failed create has no VM to resize: the resize is accepted as the create itself, at the
    new sizes (cores and memory too: there is no running VM to stop first)."""
    server = await _failed_create(stack, sim, "grow")
    status, out = await stack.call("POST", f"/servers/{server['id']}/actions/resize",
                                   json={"disk_gib": 24, "cores": 2})
    assert status == 202, out
    assert out["job"]["kind"] == "ServerCreate", out
    assert (await stack.wait_job(out["job"]["id"], timeout_s=60))["status"] == "succeeded"
    got = await stack.server(server["id"])
    assert got["status"] == "running" and (got["disk_gib"], got["cores"]) == (24, 2), got
    vm = await sim.vm(got["observed"]["vmid"])
    assert "size=24G" in vm["config"]["scsi0"] and vm["config"]["cores"] in (2, "2"), vm["config"]


async def test_a_name_in_a_deletion_buffer_says_when_and_how_it_is_freed(api: Stack) -> None:
    held, _ = await api.create_server("web-1")
    status, out = await api.call("DELETE", f"/servers/{held['id']}")
    assert status == 202 and out["server"]["status"] == "deleting", out
    delete_after = out["server"]["delete_after"]
    status, out = await api.call("POST", "/servers", json=BODY)
    assert status == 409, out
    err = out["error"]
    assert err["code"] == "uniqueness_error", out
    assert delete_after in err["message"] and f"PATCH /v1/servers/{held['id']}" in err["message"], out
    assert "cancel-deletion" in err["message"], out
    assert err["details"] == [{"kind": "server", "id": held["id"], "status": "deleting", "free_after": delete_after}]
    # freed now: the deleting server renamed
    status, out = await api.call("PATCH", f"/servers/{held['id']}", json={"name": "web-1-old"})
    assert status == 200, out
    status, out = await api.call("POST", "/servers", json=BODY)
    assert status == 202, out


async def test_one_code_and_one_details_shape_for_a_precondition_across_kinds(api: Stack) -> None:
    """A walk over every kind: a taken name is ``uniqueness_error``; any request on a resource
    being deleted is ``resource_deleting`` with ``details`` naming its kind, id and status; every
    error's ``details`` is a list of objects."""
    from z9.api.app import RESOURCES

    seen: list[dict] = []

    async def refused(method: str, path: str, status_: int, code: str, **kw: object) -> dict:
        status, out = await api.call(method, path, **kw)
        assert status == status_ and out["error"]["code"] == code, (method, path, out)
        assert isinstance(out["error"]["details"], list), out
        assert all(isinstance(d, dict) for d in out["error"]["details"]), out
        seen.append(out["error"])
        return out["error"]

    for reg in RESOURCES:
        rt = reg.rtype
        example = reg.create_model.model_config["json_schema_extra"]["examples"][0]
        status, made = await api.call("POST", f"/{rt.plural}", json=example)
        assert status == 202, made
        rid = made[rt.name]["id"]
        await refused("POST", f"/{rt.plural}", 409, "uniqueness_error", json=example)
        status, out = await api.call("DELETE", f"/{rt.plural}/{rid}")
        assert status == 202, out
        err = await refused("DELETE", f"/{rt.plural}/{rid}", 409, "resource_deleting")
        assert err["details"] == [{"kind": rt.name, "id": rid, "status": out[rt.name]["status"]}], err
        await refused("GET", f"/{rt.plural}/{rt.prefix}_nope", 404, "not_found")
        await refused("POST", f"/{rt.plural}", 422, "validation_failed", json={**example, "region": "nowhere"})
    # a kind's own actions on a deleting resource: the same code
    status, srv = await api.call("POST", "/servers", json={**BODY, "name": "act"})
    sid = srv["server"]["id"]
    assert (await api.call("DELETE", f"/servers/{sid}"))[0] == 202
    err = await refused("POST", f"/servers/{sid}/actions/start", 409, "resource_deleting")
    assert err["details"] == [{"kind": "server", "id": sid, "status": "deleting"}]
    status, adr = await api.call("POST", "/addresses", json={"region": REGION, "name": "to-a-deleting"})
    assert status == 202, adr
    err = await refused("POST", f"/addresses/{adr['address']['id']}/actions/assign", 409, "resource_deleting",
                        json={"server_id": sid})
    assert err["details"][0]["kind"] == "server", err
    # a quota: details is a list too
    await api.pool.execute("INSERT INTO tenant_quota_limits (tenant_id, unit, quota) VALUES ($1, 'servers', 0) "
                           "ON CONFLICT (tenant_id, unit) DO UPDATE SET quota = 0", api.tenant_id)
    err = await refused("POST", "/servers", 403, "quota_exceeded", json={**BODY, "name": "over"})
    assert err["details"] == [{"limit": "servers", "quota": 0, "used": err["details"][0]["used"], "requested": 1}]
    assert {e["code"] for e in seen} == {"uniqueness_error", "resource_deleting", "not_found", "validation_failed",
                                         "quota_exceeded"}
