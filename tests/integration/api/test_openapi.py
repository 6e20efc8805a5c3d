"""The OpenAPI document is generated from the API's models and operation table: it validates, its
examples match its own schemas, and a walk over every route (every registered resource type's
generic routes, and the jobs') checks each answer — success and error alike — against the schema
the document gives for that path, method and status."""
from __future__ import annotations

from typing import Any

import jsonschema
import pytest

from tests.support import Stack


def _resolve(doc: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node and node["$ref"].startswith("#/components/responses/"):
        node = doc["components"]["responses"][node["$ref"].rsplit("/", 1)[1]]
    return node


def _check(doc: dict[str, Any], path: str, method: str, status: int, body: Any) -> None:
    """``body`` matches the schema documented for (path, method, status); an undocumented status
    fails."""
    op = doc["paths"][path][method]
    assert str(status) in op["responses"], (path, method, status, body)
    schema = _resolve(doc, op["responses"][str(status)])["content"]["application/json"]["schema"]
    # the whole document as the root: its "#/components/schemas/…" references resolve
    jsonschema.Draft202012Validator({**doc, **schema}).validate(body)


class Walker:
    """Calls routes and checks every answer against the document; remembers what it covered."""

    def __init__(self, api: Stack, doc: dict[str, Any]):
        self.api, self.doc = api, doc
        self.covered: set[tuple[str, str, int]] = set()

    async def call(self, method: str, template: str, path: str, expect: int, **kw: Any) -> Any:
        status, body = await self.api.call(method, path, **kw)
        assert status == expect, (method, path, status, body)
        _check(self.doc, template, method.lower(), status, body)
        self.covered.add((template, method.lower(), status))
        return body


@pytest.fixture
async def doc(api: Stack) -> dict[str, Any]:
    async with api.http.get(api.base + "/openapi.json") as r:  # no token needed
        assert r.status == 200
        return await r.json()


async def test_document_validates_and_its_examples_match_its_schemas(doc: dict[str, Any]) -> None:
    from openapi_spec_validator import validate

    validate(doc)
    tags = {t["name"] for t in doc["tags"]}
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            assert len(op["tags"]) == 1 and op["tags"][0] in tags, (path, method)
            successes = [s for s in op["responses"] if s.startswith("2")]
            assert successes, (path, method)
            for s in successes:
                content = op["responses"][s]["content"]["application/json"]
                assert "example" in content, (path, method, s)
                _check(doc, path, method, int(s), content["example"])
            if "requestBody" in op:
                body = op["requestBody"]["content"]["application/json"]
                assert "example" in body, (path, method)
                schema = body["schema"]
                jsonschema.Draft202012Validator({**doc, **schema}).validate(body["example"])
    # required fields are marked: every property of a response body is required (null, never absent)
    server = doc["components"]["schemas"]["Server"]
    assert set(server["required"]) == set(server["properties"])
    create = doc["components"]["schemas"]["ServerCreate"]
    assert set(create["required"]) == {"name", "region", "image", "cores", "memory_mib", "disk_gib"}


async def test_every_schema_has_its_own_title_and_a_shape_generators_read(doc: dict[str, Any]) -> None:
    """Code generators name a model after its schema's title: two schemas of one title (once
    ``Member`` of clusters and of load balancers) make one of them, and all that refers to it,
    vanish from a generated client. A top-level ``anyOf``/``oneOf`` beside ``properties`` becomes
    branch-only models with untyped fields: a union is a ``oneOf``/``anyOf`` of named schemas, and
    a ``oneOf`` whose branches a field selects names it as the discriminator."""
    schemas_ = doc["components"]["schemas"]
    titles: dict[str, list[str]] = {}
    for name, schema in schemas_.items():
        assert schema.get("title"), name
        assert schema["title"] == name, (name, schema["title"])  # the key is a name, not a module path
        titles.setdefault(schema["title"], []).append(name)
        if "properties" in schema:
            assert not {"anyOf", "oneOf", "allOf"} & set(schema), (name, sorted(schema))
        for union in ("oneOf", "anyOf"):
            if union in schema:
                assert all(set(b) == {"$ref"} for b in schema[union]), (name, schema[union])
        if "oneOf" in schema:
            disc = schema["discriminator"]
            for value, ref in disc["mapping"].items():
                branch = schemas_[ref.rsplit("/", 1)[1]]
                assert branch["properties"][disc["propertyName"]]["const"] == value, (name, value)
                assert disc["propertyName"] in branch["required"], (name, ref)
    assert {t: n for t, n in titles.items() if len(n) > 1} == {}
    for name in ("HealthCheck", "Target", "ServerResize", "LoadBalancerPatch", "LoadBalancerMember", "ClusterMember"):
        assert name in schemas_, name


async def test_every_route_answers_what_the_document_says(api: Stack, doc: dict[str, Any]) -> None:
    from z9.api.app import RESOURCES, create_app

    w = Walker(api, doc)
    for reg in RESOURCES:
        rt = reg.rtype
        base, item = f"/{rt.plural}", f"/{rt.plural}/{{id}}"
        example = reg.create_model.model_config["json_schema_extra"]["examples"][0]
        created = await w.call("POST", base, base, 202, json=example)
        rid = created[rt.name]["id"]
        await w.call("POST", base, base, 409, json=example)  # the name is taken
        await w.call("POST", base, base, 422, json={**example, "region": "nowhere"})
        await w.call("POST", base, base, 400, data=b"{", headers={"Content-Type": "application/json"})
        await w.call("POST", base, base, 401, token="z9t_unknown", json=example)
        await w.call("GET", base, base, 200)
        await w.call("GET", base, base + "?status=" + rt.statuses[0] + "&limit=1", 200)
        await w.call("GET", base, base + "?limit=0", 422)
        await w.call("GET", base, base, 401, token="z9t_unknown")
        await w.call("GET", item, f"{base}/{rid}", 200)
        await w.call("GET", item, f"{base}/{rt.prefix}_nope", 404)
        await w.call("GET", item, f"{base}/{rid}", 401, token="z9t_unknown")
        if ("/" + rt.plural + "/{id}/actions/plan") in doc["paths"]:
            plan = f"{item}/actions/plan"
            await w.call("POST", plan, f"{base}/{rid}/actions/plan", 200)  # of the world as it is: its create pending
            await w.call("POST", plan, f"{base}/{rt.prefix}_nope/actions/plan", 404)
            await w.call("POST", plan, f"{base}/{rid}/actions/plan", 401, token="z9t_unknown")
        if ("/" + rt.plural + "/{id}/actions/cancel-deletion") in doc["paths"]:
            cancel = f"{item}/actions/cancel-deletion"
            await w.call("POST", cancel, f"{base}/{rid}/actions/cancel-deletion", 409)  # nothing to cancel
            await w.call("POST", cancel, f"{base}/{rt.prefix}_nope/actions/cancel-deletion", 404)
            await w.call("POST", cancel, f"{base}/{rid}/actions/cancel-deletion", 401, token="z9t_unknown")
        await w.call("DELETE", item, f"{base}/{rid}", 202)
        await w.call("DELETE", item, f"{base}/{rid}", 409)  # already deleting
        await w.call("DELETE", item, f"{base}/{rt.prefix}_nope", 404)
        await w.call("DELETE", item, f"{base}/{rid}", 401, token="z9t_unknown")
        if ("/" + rt.plural + "/{id}/actions/cancel-deletion") in doc["paths"]:
            await w.call("POST", cancel, f"{base}/{rid}/actions/cancel-deletion", 202,
                         headers={"Idempotency-Key": f"walk-{rt.name}"})
            other = (await w.call("POST", base, base, 202, json={**example, "name": example["name"] + "-b"}))
            await w.call("POST", cancel, f"{base}/{other[rt.name]['id']}/actions/cancel-deletion", 422,
                         headers={"Idempotency-Key": f"walk-{rt.name}"})  # the key was used for another request
    # the address type's own routes (PATCH, assign, unassign) and its list filters
    srv = (await w.call("POST", "/servers", "/servers", 202,
                        json={"name": "walk-srv", "region": "dev-1", "image": "debian-12", "cores": 1,
                              "memory_mib": 1024, "disk_gib": 10}))["server"]["id"]
    adr = (await w.call("POST", "/addresses", "/addresses", 202, json={"region": "dev-1", "name": "walk"}))["address"]["id"]
    item = "/addresses/{id}"
    await w.call("GET", "/addresses", f"/addresses?region=dev-1&server_id={srv}", 200)
    await w.call("GET", "/addresses", "/addresses?server_id=nope", 422)
    await w.call("PATCH", item, f"/addresses/{adr}", 200, json={"dns_ptr": "walk.example.com", "protection": {"delete": True}})
    await w.call("PATCH", item, f"/addresses/{adr}", 422, json={})
    await w.call("PATCH", item, f"/addresses/{adr}", 400, data=b"{", headers={"Content-Type": "application/json"})
    await w.call("PATCH", item, "/addresses/adr_nope", 404, json={"name": "x"})
    await w.call("PATCH", item, f"/addresses/{adr}", 401, token="z9t_unknown", json={"name": "x"})
    await w.call("DELETE", item, f"/addresses/{adr}", 409)  # protected
    await w.call("PATCH", item, f"/addresses/{adr}", 409, json={"name": "www"})  # a live name of the tenant
    assign, unassign = f"{item}/actions/assign", f"{item}/actions/unassign"
    await w.call("POST", unassign, f"/addresses/{adr}/actions/unassign", 409)  # not assigned
    await w.call("POST", assign, f"/addresses/{adr}/actions/assign", 202, json={"server_id": srv})
    await w.call("POST", assign, f"/addresses/{adr}/actions/assign", 409, json={"server_id": srv})  # already
    await w.call("POST", assign, f"/addresses/{adr}/actions/assign", 422, json={"server_id": "nope"})
    await w.call("POST", assign, f"/addresses/{adr}/actions/assign", 400, data=b"{",
                 headers={"Content-Type": "application/json"})
    await w.call("POST", assign, "/addresses/adr_nope/actions/assign", 404, json={"server_id": srv})
    await w.call("POST", assign, f"/addresses/{adr}/actions/assign", 401, token="z9t_unknown", json={"server_id": srv})
    await w.call("POST", unassign, f"/addresses/{adr}/actions/unassign", 202)
    await w.call("POST", unassign, "/addresses/adr_nope/actions/unassign", 404)
    await w.call("POST", unassign, f"/addresses/{adr}/actions/unassign", 401, token="z9t_unknown")

    # the server type's own routes (power actions, resize, PATCH): the walker's server is made
    # running and stopped by hand (no executor here; the jobs stay pending)
    sitem = "/servers/{id}"
    await w.call("POST", sitem + "/actions/start", f"/servers/{srv}/actions/start", 409)  # still creating
    await api.pool.execute("UPDATE servers SET status = 'running', power_state = 'running', vmid = 100, node = 'pve1' "
                           "WHERE id = $1", srv)
    for action in ("start", "shutdown", "poweroff", "reboot"):
        path = f"{sitem}/actions/{action}"
        await w.call("POST", path, f"/servers/{srv}/actions/{action}", 202)
        await w.call("POST", path, f"/servers/srv_nope/actions/{action}", 404)
        await w.call("POST", path, f"/servers/{srv}/actions/{action}", 401, token="z9t_unknown")
    resize = sitem + "/actions/resize"
    await w.call("POST", resize, f"/servers/{srv}/actions/resize", 409, json={"cores": 2})  # running
    await w.call("POST", resize, f"/servers/{srv}/actions/resize", 422, json={"disk_gib": 1})  # shrink
    await w.call("POST", resize, f"/servers/{srv}/actions/resize", 400, data=b"{",
                 headers={"Content-Type": "application/json"})
    await w.call("POST", resize, f"/servers/{srv}/actions/resize", 202, json={"disk_gib": 20})
    await w.call("POST", resize, "/servers/srv_nope/actions/resize", 404, json={"disk_gib": 20})
    await w.call("POST", resize, f"/servers/{srv}/actions/resize", 401, token="z9t_unknown", json={"disk_gib": 20})
    await w.call("PATCH", sitem, f"/servers/{srv}", 200, json={"name": "walk-srv-2", "labels": {"env": "walk"}})
    await w.call("PATCH", sitem, f"/servers/{srv}", 422, json={"labels": {"": "x"}})
    await w.call("PATCH", sitem, f"/servers/{srv}", 400, data=b"{", headers={"Content-Type": "application/json"})
    await w.call("PATCH", sitem, "/servers/srv_nope", 404, json={"name": "x"})
    await w.call("PATCH", sitem, f"/servers/{srv}", 401, token="z9t_unknown", json={"name": "x"})

    # a job's own routes: cancel a pending one, re-run it (a cancelled job is failed)
    listed = await w.call("GET", "/jobs", f"/jobs?resource_id={srv}", 200)
    resized = [j["id"] for j in listed["jobs"] if j["kind"] == "ServerResize"][0]
    cancel, rerun = "/jobs/{id}/actions/cancel", "/jobs/{id}/actions/rerun"
    await w.call("POST", rerun, f"/jobs/{resized}/actions/rerun", 409)  # not failed
    done = await w.call("POST", cancel, f"/jobs/{resized}/actions/cancel", 200)
    assert done["job"]["status"] == "failed" and done["job"]["error"]["class"] == "cancelled"
    await w.call("POST", cancel, f"/jobs/{resized}/actions/cancel", 200)  # cancelled already: the same answer
    await w.call("POST", cancel, "/jobs/job_nope/actions/cancel", 404)
    await w.call("POST", cancel, f"/jobs/{resized}/actions/cancel", 401, token="z9t_unknown")
    again = await w.call("POST", rerun, f"/jobs/{resized}/actions/rerun", 202)
    assert again["job"]["kind"] == "ServerResize" and again["job"]["status"] == "pending"
    assert again["job"]["id"] != resized
    await w.call("POST", rerun, "/jobs/job_nope/actions/rerun", 404)
    await w.call("POST", rerun, f"/jobs/{resized}/actions/rerun", 401, token="z9t_unknown")
    # the catalogue
    regions = await w.call("GET", "/regions", "/regions", 200)
    assert [r["name"] for r in regions["regions"]] == ["dev-1"]
    await w.call("GET", "/regions", "/regions", 401, token="z9t_unknown")
    await w.call("GET", "/regions", "/regions?color=red", 400)
    images = await w.call("GET", "/images", "/images?region=dev-1", 200)
    from z9.sim.server import KUBERNETES_IMAGES

    assert images["images"] == [{"name": "debian-12", "regions": ["dev-1"], "disk_gib": None, "kubernetes": None},
                                *({"name": i, "regions": ["dev-1"], "disk_gib": None, "kubernetes": r}
                                  for i, r in sorted(KUBERNETES_IMAGES.items()))]
    await w.call("GET", "/images", "/images?region=nowhere", 422)
    await w.call("GET", "/images", "/images", 401, token="z9t_unknown")
    # the load balancer actions (a fresh one: the generic walk deleted its own)
    created = await w.call("POST", "/load-balancers", "/load-balancers", 202, json={
        "name": "walk-lb", "region": "dev-1", "services": [{"protocol": "tcp", "listen_port": 80,
                                                            "destination_port": 8080}]})
    lb = created["load_balancer"]["id"]
    bodies = {"add_target": {"type": "ip", "ip": "198.51.100.201"}, "remove_target": {"type": "ip", "ip": "198.51.100.201"},
              "add_service": {"protocol": "http", "listen_port": 81, "destination_port": 8081},
              "update_service": {"listen_port": 81, "destination_port": 9081},
              "delete_service": {"listen_port": 81}, "change_algorithm": {"type": "least_connections"}}
    # the kebab-case paths, then (on another load balancer: at most 8 live jobs each) the snake_case
    # ones they replaced, deprecated aliases for one release
    other = (await w.call("POST", "/load-balancers", "/load-balancers", 202, json={
        "name": "walk-lb-b", "region": "dev-1", "services": [{"protocol": "tcp", "listen_port": 80,
                                                              "destination_port": 8080}]}))["load_balancer"]["id"]
    for name, body, lb in ([(n.replace("_", "-"), b, lb) for n, b in bodies.items()]
                           + [(n, b, other) for n, b in bodies.items()]):
        tpl = "/load-balancers/{id}/actions/" + name
        assert doc["paths"][tpl]["post"].get("deprecated", False) == ("_" in name), tpl
        await w.call("POST", tpl, f"/load-balancers/{lb}/actions/{name}", 202, json=body)
        await w.call("POST", tpl, f"/load-balancers/lb_nope/actions/{name}", 404, json=body)
        await w.call("POST", tpl, f"/load-balancers/{lb}/actions/{name}", 401, token="z9t_unknown", json=body)
        await w.call("POST", tpl, f"/load-balancers/{lb}/actions/{name}", 400, data=b"{",
                     headers={"Content-Type": "application/json"})
    lb = created["load_balancer"]["id"]
    await w.call("POST", "/load-balancers/{id}/actions/delete-service",
                 f"/load-balancers/{lb}/actions/delete-service", 409, json={"listen_port": 81})
    await w.call("POST", "/load-balancers/{id}/actions/add-target",
                 f"/load-balancers/{lb}/actions/add-target", 422, json={"type": "ip"})
    litem = "/load-balancers/{id}"
    await w.call("PATCH", litem, f"/load-balancers/{lb}", 200, json={"name": "walk-lb-2", "labels": {"env": "walk"}})
    await w.call("PATCH", litem, f"/load-balancers/{lb}", 422, json={"labels": {"": "x"}})
    await w.call("PATCH", litem, f"/load-balancers/{lb}", 400, data=b"{", headers={"Content-Type": "application/json"})
    await w.call("PATCH", litem, "/load-balancers/lb_nope", 404, json={"name": "x"})
    await w.call("PATCH", litem, f"/load-balancers/{lb}", 401, token="z9t_unknown", json={"name": "x"})
    other = (await w.call("POST", "/load-balancers", "/load-balancers", 202,
                          json={"name": "walk-lb-3", "region": "dev-1"}))["load_balancer"]["id"]
    await w.call("PATCH", litem, f"/load-balancers/{other}", 409, json={"name": "walk-lb-2"})
    # the cluster type's own routes: kubeconfig (409 before the first Ready, then minted) and node pools
    k8s = (await w.call("POST", "/clusters", "/clusters", 202,
                        json={"name": "walk-k8s", "region": "dev-1", "version": "1.33", "control_plane": {"count": 1},
                              "node_pools": [{"name": "workers", "count": 1}]}))["cluster"]["id"]
    kc = "/clusters/{id}/kubeconfig"
    await w.call("GET", kc, f"/clusters/{k8s}/kubeconfig", 409)  # cluster_not_ready
    await api.pool.execute("UPDATE clusters SET initialized_at = now() WHERE id = $1", k8s)
    await w.call("GET", kc, f"/clusters/{k8s}/kubeconfig?expiry_s=600", 200)
    await w.call("GET", kc, f"/clusters/{k8s}/kubeconfig?expiry_s=5", 422)
    await w.call("GET", kc, "/clusters/k8s_nope/kubeconfig", 404)
    await w.call("GET", kc, f"/clusters/{k8s}/kubeconfig", 401, token="z9t_unknown")
    cr = "/clusters/{id}/credentials"
    await w.call("GET", cr, f"/clusters/{k8s}/credentials?limit=5", 200)
    await w.call("GET", cr, f"/clusters/{k8s}/credentials?limit=0", 422)
    await w.call("GET", cr, "/clusters/k8s_nope/credentials", 404)
    await w.call("GET", cr, f"/clusters/{k8s}/credentials", 401, token="z9t_unknown")
    for action, good, bad in (("add-node-pool", {"name": "batch", "count": 1}, {"name": "cp", "count": 1}),
                              ("resize-node-pool", {"pool": "workers", "count": 3}, {"pool": "nope", "count": 1}),
                              ("remove-node-pool", {"pool": "batch"}, {"pool": "nope"}),
                              ("rotate-credentials", {}, {"name": "x"})):
        tpl = f"/clusters/{{id}}/actions/{action}"
        await w.call("POST", tpl, f"/clusters/{k8s}/actions/{action}", 202, json=good)
        await w.call("POST", tpl, f"/clusters/{k8s}/actions/{action}", 422, json=bad)
        await w.call("POST", tpl, f"/clusters/{k8s}/actions/{action}", 400, data=b"{",
                     headers={"Content-Type": "application/json"})
        await w.call("POST", tpl, f"/clusters/k8s_nope/actions/{action}", 404, json=good)
        await w.call("POST", tpl, f"/clusters/{k8s}/actions/{action}", 401, token="z9t_unknown", json=good)
    await w.call("POST", "/clusters/{id}/actions/add-node-pool", f"/clusters/{k8s}/actions/add-node-pool", 409,
                 json={"name": "workers", "count": 1})  # the pool exists
    await w.call("PATCH", "/clusters/{id}", f"/clusters/{k8s}", 200, json={"labels": {"env": "prod"}})
    await w.call("PATCH", "/clusters/{id}", f"/clusters/{k8s}", 422, json={"labels": {"env": "no way"}})
    await w.call("PATCH", "/clusters/{id}", f"/clusters/{k8s}", 400, data=b"{",
                 headers={"Content-Type": "application/json"})
    await w.call("PATCH", "/clusters/{id}", "/clusters/k8s_nope", 404, json={"labels": {}})
    await w.call("PATCH", "/clusters/{id}", f"/clusters/{k8s}", 401, token="z9t_unknown", json={"labels": {}})

    jobs = await w.call("GET", "/jobs", "/jobs", 200)
    await w.call("GET", "/jobs", "/jobs?after=job_nope", 422)
    await w.call("GET", "/jobs", "/jobs", 401, token="z9t_unknown")
    await w.call("GET", "/jobs/{id}", f"/jobs/{jobs['jobs'][0]['id']}", 200)
    await w.call("GET", "/jobs/{id}", "/jobs/job_nope", 404)
    await w.call("GET", "/jobs/{id}", "/jobs/job_nope", 401, token="z9t_unknown")
    await w.call("GET", "/jobs/{id}", f"/jobs/{jobs['jobs'][0]['id']}?wait_s=1", 200)
    await w.call("GET", "/jobs/{id}", f"/jobs/{jobs['jobs'][0]['id']}?wait_s=61", 400)
    await w.call("GET", "/jobs", f"/jobs?actor=me", 200)
    await w.call("GET", "/jobs", "/jobs?actor=nope", 422)
    newest = await w.call("GET", "/jobs", "/jobs?order=newest&include_observe=false&limit=2", 200)
    assert [j["id"] for j in newest["jobs"]] == [j["id"] for j in jobs["jobs"][::-1][:2]]
    await w.call("GET", "/jobs", "/jobs?status=succeeded&kind=ServerCreate", 200)
    await w.call("GET", "/jobs", "/jobs?order=sideways", 422)
    await w.call("GET", "/jobs", "/jobs?include_observe=maybe", 422)
    await w.call("GET", "/jobs", "/jobs?status=done", 422)
    await w.call("GET", "/servers", "/servers?include_deleted=false", 200)
    await w.call("GET", "/servers", "/servers?include_deleted=yes", 422)

    # the volume's own routes
    vol = (await w.call("POST", "/volumes", "/volumes", 202, json={"name": "walk-vol", "region": "dev-1",
                                                                 "size_gib": 2}))["volume"]["id"]
    await w.call("GET", "/volumes", f"/volumes?region=dev-1&server_id={srv}", 200)
    await w.call("GET", "/volumes", "/volumes?server_id=nope", 422)
    vitem = "/volumes/{id}"
    await w.call("PATCH", vitem, f"/volumes/{vol}", 200, json={"labels": {"env": "walk"}})
    await w.call("PATCH", vitem, f"/volumes/{vol}", 422, json={})
    await w.call("PATCH", vitem, "/volumes/vol_nope", 404, json={"name": "x"})
    await w.call("PATCH", vitem, f"/volumes/{vol}", 401, token="z9t_unknown", json={"name": "x"})
    for action, good, bad in (("attach", {"server_id": srv}, {"server_id": "nope"}),
                              ("resize", {"size_gib": 3}, {"size_gib": 1}),
                              ("detach", None, None)):
        tpl = f"/volumes/{{id}}/actions/{action}"
        await w.call("POST", tpl, f"/volumes/{vol}/actions/{action}", 202, json=good)
        if bad is not None:
            await w.call("POST", tpl, f"/volumes/{vol}/actions/{action}", 422, json=bad)
        await w.call("POST", tpl, f"/volumes/vol_nope/actions/{action}", 404, json=good)
        await w.call("POST", tpl, f"/volumes/{vol}/actions/{action}", 401, token="z9t_unknown", json=good)
    await w.call("POST", "/volumes/{id}/actions/detach", f"/volumes/{vol}/actions/detach", 409)  # not attached
    await w.call("DELETE", "/servers/{id}", f"/servers/{srv}?delete_volumes=maybe", 422)

    # the network's own routes (a server joins and leaves it through the server's actions)
    net = (await w.call("GET", "/networks", "/networks?region=dev-1", 200))["networks"][0]["id"]
    nitem = "/networks/{id}"
    await w.call("PATCH", nitem, f"/networks/{net}", 200, json={"labels": {"env": "walk"}})
    await w.call("PATCH", nitem, f"/networks/{net}", 422, json={})
    await w.call("PATCH", nitem, "/networks/net_nope", 404, json={"name": "x"})
    await w.call("PATCH", nitem, f"/networks/{net}", 401, token="z9t_unknown", json={"name": "x"})
    net2 = (await w.call("POST", "/networks", "/networks", 202, json={"name": "walk-net2", "region": "dev-1",
                                                                       "ip_range": "10.77.0.0/24"}))["network"]["id"]
    members = "/networks/{id}/members"
    await w.call("GET", members, f"/networks/{net}/members", 200)
    await w.call("GET", members, "/networks/net_nope/members", 404)
    await w.call("GET", members, f"/networks/{net}/members", 401, token="z9t_unknown")
    for action, good, bad in (("attach-to-network", {"network_id": net, "ip": "10.0.0.9"}, {"network_id": "nope"}),
                              ("detach-from-network", {"network_id": net}, {"network_id": "nope"}),
                              # Hetzner's spellings (aliases of the same operations), on a second network
                              ("attach_to_network", {"network_id": net2}, {"network_id": "nope"}),
                              ("detach_from_network", {"network_id": net2}, {"network_id": "nope"})):
        tpl = f"/servers/{{id}}/actions/{action}"
        await w.call("POST", tpl, f"/servers/{srv}/actions/{action}", 202, json=good)
        await w.call("POST", tpl, f"/servers/{srv}/actions/{action}", 422, json=bad)
        await w.call("POST", tpl, f"/servers/srv_nope/actions/{action}", 404, json=good)
        await w.call("POST", tpl, f"/servers/{srv}/actions/{action}", 401, token="z9t_unknown", json=good)
    await w.call("POST", "/servers/{id}/actions/detach_from_network", f"/servers/{srv}/actions/detach_from_network",
                 409, json={"network_id": net})
    await w.call("POST", "/servers/{id}/actions/attach_to_network", f"/servers/{srv}/actions/attach_to_network",
                 409, json={"network_id": net})  # its detach under way: server_already_attached until it is done  # not attached (its detach is under way: the row says detaching)
    # the firewall's own routes
    fw = (await w.call("POST", "/firewalls", "/firewalls", 202, json={"name": "walk-fw", "region": "dev-1"}))["firewall"]["id"]
    await w.call("GET", "/firewalls", "/firewalls?region=dev-1", 200)
    fitem = "/firewalls/{id}"
    await w.call("PATCH", fitem, f"/firewalls/{fw}", 200, json={"labels": {"env": "walk"}})
    await w.call("PATCH", fitem, f"/firewalls/{fw}", 422, json={})
    await w.call("PATCH", fitem, "/firewalls/fw_nope", 404, json={"name": "x"})
    await w.call("PATCH", fitem, f"/firewalls/{fw}", 401, token="z9t_unknown", json={"name": "x"})
    for action, good, bad in (("set-rules", {"rules": []}, {"rules": [{"direction": "in", "protocol": "tcp"}]}),
                              ("apply-to-resources", {"apply_to": [{"server_id": srv}]}, {"apply_to": [{}]}),
                              ("remove-from-resources", {"remove_from": [{"server_id": srv}]}, {"remove_from": []}),
                              # Hetzner's spellings (aliases)
                              ("set_rules", {"rules": []}, {"rules": [{"direction": "in", "protocol": "tcp"}]}),
                              ("apply_to_resources", {"apply_to": [{"server_id": srv}]}, {"apply_to": [{}]}),
                              ("remove_from_resources", {"remove_from": [{"server_id": srv}]}, {"remove_from": []})):
        tpl = f"/firewalls/{{id}}/actions/{action}"
        await w.call("POST", tpl, f"/firewalls/{fw}/actions/{action}", 202, json=good)
        await w.call("POST", tpl, f"/firewalls/{fw}/actions/{action}", 422, json=bad)
        await w.call("POST", tpl, f"/firewalls/fw_nope/actions/{action}", 404, json=good)
        await w.call("POST", tpl, f"/firewalls/{fw}/actions/{action}", 401, token="z9t_unknown", json=good)
    await w.call("POST", "/firewalls/{id}/actions/apply-to-resources", f"/firewalls/{fw}/actions/apply-to-resources",
                 202, json={"apply_to": [{"server_id": srv}]})
    await w.call("POST", "/firewalls/{id}/actions/apply-to-resources", f"/firewalls/{fw}/actions/apply-to-resources",
                 409, json={"apply_to": [{"server_id": srv}]})  # firewall_already_applied
    await w.call("DELETE", fitem, f"/firewalls/{fw}", 409)  # resource_in_use

    # the caller's own quotas and use
    quota = await w.call("GET", "/quota", "/quota", 200)
    assert set(quota["quotas"]) == {"servers", "cores", "memory_mib", "addresses", "load_balancers", "volume_gib"}
    await w.call("GET", "/quota", "/quota", 401, token="z9t_unknown")

    # the tokens' routes (issue 12)
    tok = await w.call("POST", "/tokens", "/tokens", 201, json={"name": "walk", "scopes": ["read"]})
    await w.call("POST", "/tokens", "/tokens", 422, json={"name": ""})
    await w.call("POST", "/tokens", "/tokens", 400, data=b"{", headers={"Content-Type": "application/json"})
    await w.call("POST", "/tokens", "/tokens", 401, token="z9t_unknown", json={"name": "walk"})
    await w.call("POST", "/tokens", "/tokens", 403, token=tok["secret"], json={"name": "walk2"})  # read-only
    await w.call("GET", "/tokens", "/tokens?include_revoked=true", 200)
    await w.call("GET", "/tokens", "/tokens?limit=0", 422)
    await w.call("GET", "/tokens", "/tokens", 401, token="z9t_unknown")
    await w.call("DELETE", "/tokens/{id}", f"/tokens/{tok['token']['id']}", 403, token=tok["secret"])
    await w.call("DELETE", "/tokens/{id}", f"/tokens/{tok['token']['id']}", 200)
    await w.call("DELETE", "/tokens/{id}", "/tokens/tok_nope", 404)
    await w.call("DELETE", "/tokens/{id}", "/tokens/tok_nope", 401, token="z9t_unknown")

    # the operator's views (a token with the operator scope; any other: 403)
    import secrets as _secrets

    from z9.common import store as _store

    op = "z9t_" + _secrets.token_urlsafe(24)
    await _store.api_token_insert(api.pool, api.tenant_id, op, "ops", scopes=["read", "write", "operator"])
    some_job = jobs["jobs"][0]["id"]
    for template, real in (("/operator/jobs", "/operator/jobs?region=dev-1&status=succeeded&limit=5"),
                           ("/operator/regions", "/operator/regions"),
                           ("/operator/guard-refusals", "/operator/guard-refusals?limit=5"),
                           ("/operator/drift", "/operator/drift?kind=server&limit=5"),
                           ("/operator/sdn", "/operator/sdn"),
                           ("/operator/jobs/{id}", f"/operator/jobs/{some_job}")):
        await w.call("GET", template, real, 200, token=op)
        await w.call("GET", template, real, 403)  # the tenant's own token
        await w.call("GET", template, real, 401, token="z9t_unknown")
    await w.call("GET", "/operator/jobs", "/operator/jobs?status=done", 422, token=op)
    await w.call("GET", "/operator/guard-refusals", "/operator/guard-refusals?limit=0", 422, token=op)
    await w.call("GET", "/operator/drift", "/operator/drift?kind=nope", 422, token=op)
    await w.call("GET", "/operator/jobs/{id}", "/operator/jobs/job_nope", 404, token=op)
    cancel_op = "/operator/jobs/{id}/actions/cancel"
    failed = (await w.call("GET", "/jobs", "/jobs?status=failed&limit=500", 200))["jobs"]
    cancelled = next(j["id"] for j in failed if (j["error"] or {}).get("class") == "cancelled")
    # a job of the tenant cancelled already: the operator's cancel answers it again (idempotent)
    await w.call("POST", cancel_op, f"/operator/jobs/{cancelled}/actions/cancel", 200, token=op)
    await w.call("POST", cancel_op, "/operator/jobs/job_nope/actions/cancel", 404, token=op)
    await w.call("POST", cancel_op, f"/operator/jobs/{some_job}/actions/cancel", 403)
    await w.call("POST", cancel_op, f"/operator/jobs/{some_job}/actions/cancel", 401, token="z9t_unknown")

    # every route of the app is documented, and every documented success was exercised
    routes = set()
    for route in create_app(api.settings, pool=api.pool).router.routes():
        path = route.resource.canonical
        if path.startswith("/v1/") and path != "/v1/openapi.json" and route.method != "HEAD":
            routes.add((path[3:], route.method.lower()))
    assert routes == {(p, m) for p, ops in doc["paths"].items() for m in ops}
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            for s in op["responses"]:
                if s.startswith("2") or s in ("401", "404"):
                    assert (path, method, int(s)) in w.covered, (path, method, s)


async def test_refusals_before_the_handler_are_documented_on_every_route(api: Stack, doc: dict[str, Any]) -> None:
    """What any route may answer before its own checks — a read-only token on a write (403), an
    Idempotency-Key that is not 1-255 printable characters (400) where the operation takes one,
    a body over the size limit (413) — is in the document for that route, with the error
    schema (a 403 on POST /servers was undocumented)."""
    w = Walker(api, doc)
    srv, _ = await api.create_server("refusals")
    status, out = await api.call("POST", "/addresses", json={"region": "dev-1", "server_id": srv["id"]})
    assert status == 202, out
    adr = out["address"]["id"]
    status, ro = await api.call("POST", "/tokens", json={"name": "ro", "scopes": ["read"]})
    assert status == 201, ro
    ids = {"servers": srv["id"], "addresses": adr}
    for path, ops in doc["paths"].items():
        parts = path.split("/")
        if "{id}" in parts and parts[1] not in ids:
            continue
        real = path.replace("{id}", ids.get(parts[1], ""))
        for method, op in ops.items():
            if method in ("get", "head"):
                continue
            if any(p.get("name") == "Idempotency-Key" for p in op.get("parameters", [])):
                await w.call(method.upper(), path, real, 400, headers={"Idempotency-Key": "bad key"},
                             json=op.get("requestBody", {}).get("content", {}).get("application/json", {})
                             .get("example"))
            if path.endswith("/actions/plan"):  # a POST that only reads: a read token may send it
                await w.call(method.upper(), path, real, 200, token=ro["secret"])
            else:
                await w.call(method.upper(), path, real, 403, token=ro["secret"], json={})
            if "requestBody" in op:
                await w.call(method.upper(), path, real, 413, data=b"{" + b" " * (300 * 1024) + b"}",
                             headers={"Content-Type": "application/json"})
