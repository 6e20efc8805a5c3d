"""Token management and tenant lanes: POST/GET/DELETE /v1/tokens, scopes (read gets 403 on
mutations; operator only from `z9 token`), expiry, revocation within the cache time, coarse last
use, the actor of every job (GET /v1/jobs?actor=), and platform details hidden from tenants."""
from __future__ import annotations

import os
import subprocess
import sys
from typing import Any, AsyncIterator

import asyncpg
import pytest

from z9.api.tokens import TOUCHER, redact
from z9.common import store
from z9.common.clock import TestClock
from z9.common.settings import Settings
from z9.common.store import Lease

from tests.support import REGION, Stack, api_stack, make_tenant, service_env, wait_until


async def call(api: Stack, method: str, path: str, token: str | None = None, *,
               headers: dict[str, str] | None = None, **kw: Any) -> tuple[int, Any, Any]:
    async with api.http.request(method, api.base + path, headers={**api.headers(token), **(headers or {})},
                                **kw) as r:
        return r.status, await r.json(), r.headers


async def token_id(api: Stack, token: str) -> str:
    return (await store.api_token_auth(api.pool, token))["id"]


@pytest.fixture
async def fast(settings: Settings, pool: asyncpg.Pool, clock: TestClock) -> AsyncIterator[Stack]:
    """The API with a 0.5 s token cache and last use written every 0.3 s, on the test's clock."""
    async with api_stack(settings.model_copy(update={"api_token_cache_s": 0.5, "api_token_last_used_s": 0.3}),
                         pool, clock=clock) as stack:
        yield stack


async def test_create_list_and_revoke(fast: Stack) -> None:
    status, out, headers = await call(fast, "POST", "/tokens", json={"name": "ci", "scopes": ["read"],
                                                                     "expires_in_s": 3600})
    assert status == 201, out
    assert headers["Location"] == f"/v1/tokens/{out['token']['id']}" and headers["Cache-Control"] == "no-store"
    secret, tok = out["secret"], out["token"]
    assert secret.startswith("z9t_") and tok["scopes"] == ["read"] and tok["expires_at"]
    assert tok["created_by"] == await token_id(fast, fast.token)
    # the secret works, is stored only as a hash, and is never listed
    assert (await call(fast, "GET", "/servers", secret))[0] == 200
    assert await fast.pool.fetchval("SELECT token_sha256 FROM api_tokens WHERE id = $1", tok["id"]) == \
        store.token_sha256(secret)
    assert await fast.pool.fetchval("SELECT count(*) FROM api_tokens t WHERE strpos(t::text, $1) > 0", secret) == 0
    status, listed, _ = await call(fast, "GET", "/tokens")
    assert status == 200 and secret not in str(listed)
    assert {t["name"] for t in listed["tokens"]} == {"default", "ci"}
    # revoke: 401 at once on this API process (its cache entry goes), with WWW-Authenticate
    status, out, _ = await call(fast, "DELETE", f"/tokens/{tok['id']}")
    assert status == 200 and out["token"]["revoked_at"]
    status, out, headers = await call(fast, "GET", "/servers", secret)
    assert status == 401 and headers["WWW-Authenticate"].startswith("Bearer")
    assert (await call(fast, "DELETE", f"/tokens/{tok['id']}"))[0] == 200  # idempotent
    status, listed, _ = await call(fast, "GET", "/tokens")
    assert [t["name"] for t in listed["tokens"]] == ["default"]
    status, listed, _ = await call(fast, "GET", "/tokens?include_revoked=true")
    assert len(listed["tokens"]) == 2
    for bad in ({"name": "x", "scopes": ["operator"]}, {"name": "x", "scopes": []}, {"name": "x", "expires_in_s": 5},
                {"name": "", "scopes": ["read"]}, {"name": "x", "extra": 1}):
        status, out, _ = await call(fast, "POST", "/tokens", json=bad)
        assert status == 422, (bad, out)
    status, out, _ = await call(fast, "POST", "/tokens", json={"name": "x"}, headers={"Idempotency-Key": "k1"})
    assert status == 400 and "Idempotency-Key" in out["error"]["message"]


async def test_revoked_elsewhere_stops_within_the_cache_time(fast: Stack, settings: Settings,
                                                             pool: asyncpg.Pool, clock: TestClock) -> None:
    _, out, _ = await call(fast, "POST", "/tokens", json={"name": "other-process"})
    secret = out["secret"]
    async with api_stack(settings.model_copy(update={"api_token_cache_s": 0.5}), pool, clock=clock) as other:
        clock.pin()  # the cache time passes only when the test says so
        assert (await call(other, "GET", "/servers", secret))[0] == 200  # cached there now
        assert (await call(fast, "DELETE", f"/tokens/{out['token']['id']}"))[0] == 200
        assert (await call(other, "GET", "/servers", secret))[0] == 200  # within the cache time
        clock.step(0.5)  # the cache time is over
        assert (await call(other, "GET", "/servers", secret))[0] == 401


async def test_read_scope_cannot_mutate_and_scopes_are_not_escalated(fast: Stack) -> None:
    _, out, _ = await call(fast, "POST", "/tokens", json={"name": "ro", "scopes": ["read"]})
    ro = out["secret"]
    assert (await call(fast, "GET", "/jobs", ro))[0] == 200
    _, srv_job = await fast.create_server("ro-1")
    for method, path, body in (("POST", "/servers", {"name": "x"}), ("DELETE", "/servers/srv_00000000000000000000000000", None),
                               ("POST", "/tokens", {"name": "y", "scopes": ["read"]}),
                               ("DELETE", f"/tokens/{out['token']['id']}", None)):
        status, err, _ = await call(fast, method, path, ro, json=body)
        assert status == 403 and err["error"]["code"] == "insufficient_scope", (method, path, err)
        assert "write" in err["error"]["message"]
    # a write token cannot grant what it lacks either: operator is not even a valid API scope
    status, err, _ = await call(fast, "POST", "/tokens", json={"name": "op", "scopes": ["read", "operator"]})
    assert status == 422 and "scopes" in err["error"]["message"]


async def test_expired_token_is_refused(fast: Stack, clock: TestClock) -> None:
    _, out, _ = await call(fast, "POST", "/tokens", json={"name": "short", "expires_in_s": 60})
    assert (await call(fast, "GET", "/servers", out["secret"]))[0] == 200  # valid (and cached)
    clock.step(60)  # its 60 s are over (and the cache time too)
    status, err, headers = await call(fast, "GET", "/servers", out["secret"])
    assert status == 401 and "expired" in err["error"]["message"] and "WWW-Authenticate" in headers


async def test_last_use_is_coarse(fast: Stack, clock: TestClock) -> None:
    toucher = fast.app[TOUCHER]
    _, out, _ = await call(fast, "POST", "/tokens", json={"name": "used"})
    clock.pin()  # the toucher's periods pass only when the test steps them
    writes0 = toucher.writes
    for _ in range(30):
        assert (await call(fast, "GET", "/servers", out["secret"]))[0] == 200
    assert toucher.writes == writes0  # nothing written per request
    clock.step(fast.settings.api_token_last_used_s)  # one period
    await wait_until(lambda: toucher.writes > writes0, 10, "the period's write")
    assert toucher.writes - writes0 == 1  # one statement per period for all tokens, not one per request
    _, listed, _ = await call(fast, "GET", "/tokens")
    used = {t["name"]: t for t in listed["tokens"]}["used"]
    assert used["last_used_at"] is not None


async def test_other_tenants_tokens_are_404(fast: Stack) -> None:
    _, other = await make_tenant(fast.pool, "globex")
    other_id = await token_id(fast, other)
    status, err, _ = await call(fast, "DELETE", f"/tokens/{other_id}")
    assert status == 404
    _, listed, _ = await call(fast, "GET", "/tokens")
    assert other_id not in str(listed)
    assert (await call(fast, "GET", "/servers", other))[0] == 200  # untouched


async def test_every_job_records_its_actor(fast: Stack) -> None:
    _, out, _ = await call(fast, "POST", "/tokens", json={"name": "second"})
    second, second_id = out["secret"], out["token"]["id"]
    mine = await token_id(fast, fast.token)
    _, job1 = await fast.create_server("a1")
    status, out, _ = await call(fast, "POST", "/servers", second,
                                json={"name": "a2", "region": REGION, "image": "debian-12", "cores": 1,
                                      "memory_mib": 1024, "disk_gib": 10}, headers={"X-Request-Id": "req-a2"})
    assert status == 202, out
    job2 = out["job"]
    assert (await fast.job(job1["id"]))["actor"] == mine
    j2 = await fast.job(job2["id"])
    assert j2["actor"] == second_id
    _, listed, _ = await call(fast, "GET", f"/jobs?actor={second_id}")
    assert [j["id"] for j in listed["jobs"]] == [job2["id"]]
    _, listed, _ = await call(fast, "GET", "/jobs?actor=me", second)
    assert [j["id"] for j in listed["jobs"]] == [job2["id"]]
    _, listed, _ = await call(fast, "GET", "/jobs?actor=me")
    assert [j["id"] for j in listed["jobs"]] == [job1["id"]]
    status, err, _ = await call(fast, "GET", "/jobs?actor=bob")
    assert status == 422 and err["error"]["message"].startswith("actor:")
    # every job of every resource type: an address create (its own allocating statement), an
    # assignment, a server create with a primary address (its AddressAssign)
    status, out, _ = await call(fast, "POST", "/addresses", second, json={"region": REGION, "name": "a3"},
                                headers={"X-Request-Id": "req-a3"})
    assert status == 202, out
    status, assigned, _ = await call(fast, "POST", f"/addresses/{out['address']['id']}/actions/assign", second,
                                     json={"server_id": j2["resource"]["id"]}, headers={"X-Request-Id": "req-a4"})
    assert status == 202, assigned
    status, primary, _ = await call(fast, "POST", "/servers", second,
                                    json={"name": "a5", "region": REGION, "image": "debian-12", "cores": 1,
                                          "memory_mib": 1024, "disk_gib": 10, "public_ipv4": True},
                                    headers={"X-Request-Id": "req-a5"})
    assert status == 202, primary
    _, listed, _ = await call(fast, "GET", "/jobs?actor=me&limit=500", second)
    seen = {(j["kind"], j["request_id"]) for j in listed["jobs"]}
    assert {("AddressCreate", "req-a3"), ("AddressAssign", "req-a4"), ("ServerCreate", "req-a5"),
            ("AddressAssign", "req-a5")} <= seen, seen
    assert all(j["actor"] == second_id for j in listed["jobs"])


def test_redact_hides_the_upid_user_and_known_accounts() -> None:
    upid = b"UPID:pve1:0000A1B2:0012C3D4:6756A1B2:qmclone:9000:root@pam!z9:"
    body = b'{"steps": [{"detail": {"upid": "' + upid + b'"}}], "error": "root@pam!z9 lacks VM.Allocate"}'
    out = redact(body, (b"root@pam!z9", b"root@pam"))
    assert b"root@pam" not in out and b"!z9" not in out
    assert b"UPID:pve1:0000A1B2:0012C3D4:6756A1B2:qmclone:9000:hidden:" in out
    assert redact(b'{"a": "plain"}', ()) == b'{"a": "plain"}'


async def test_step_details_hidden_from_tenants_shown_to_operators(fast: Stack, settings: Settings) -> None:
    _, job = await fast.create_server("up-1")
    claimed = await store.job_claim(fast.pool, [REGION], 10, "owner-x", 30)
    lease = Lease(job["id"], "owner-x", claimed[0].attempt)
    account = settings.regions[REGION].token_id
    upid = f"UPID:pve1:0000A1B2:0012C3D4:6756A1B2:qmclone:9000:{account}:"
    await store.job_progress(fast.pool, lease, [{"name": "clone", "state": "running", "detail": {"upid": upid}}], 30)
    tenant_view = await fast.job(job["id"])
    text = str(tenant_view)
    assert account not in text and account.split("!")[0] not in text and "root@pam" not in text
    assert tenant_view["steps"][0]["detail"]["upid"].endswith(":qmclone:9000:hidden:")
    # an operator token (only `z9 token` grants it) of the same tenant sees it all
    env = service_env(settings)
    out = subprocess.run([os.path.join(os.path.dirname(sys.executable), "z9"), "token", "--tenant", "acme",
                          "--name", "ops", "--scope", "read", "--scope", "operator"],
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    operator = out.stdout.strip()
    status, op_view, _ = await call(fast, "GET", f"/jobs/{job['id']}", operator)
    assert status == 200 and op_view["steps"][0]["detail"]["upid"] == upid
    _, listed, _ = await call(fast, "GET", "/jobs")
    assert account not in str(listed)
    # the operator token is read-only here: operator adds visibility, not rights
    assert (await call(fast, "DELETE", f"/servers/{job['id']}", operator))[0] == 403


async def test_another_tenants_token_gets_404_on_every_route_with_an_id(fast: Stack) -> None:
    """Walks the router: every route with an {id}, called by another tenant with ids that exist
    in this one, answers 404 and changes nothing."""
    server, job = await fast.create_server("mine-1")
    _, tok, _ = await call(fast, "POST", "/tokens", json={"name": "mine"})
    _, adr, _ = await call(fast, "POST", "/addresses", json={"region": "dev-1", "name": "mine-a"})
    _, lb, _ = await call(fast, "POST", "/load-balancers", json={
        "name": "mine-lb", "region": "dev-1", "services": [{"protocol": "tcp", "listen_port": 80, "destination_port": 8080}]})
    _, k8s, _ = await call(fast, "POST", "/clusters", json={
        "name": "mine-k8s", "region": "dev-1", "version": "1.33",
        "control_plane": {"count": 1, "cores": 2, "memory_mib": 4096, "disk_gib": 30},
        "node_pools": [{"name": "workers", "count": 1, "cores": 2, "memory_mib": 4096, "disk_gib": 30}]})
    _, vol, _ = await call(fast, "POST", "/volumes", json={"name": "mine-v", "region": "dev-1", "size_gib": 10})
    _, fw, _ = await call(fast, "POST", "/firewalls", json={"name": "mine-fw", "region": "dev-1"})
    _, net, _ = await call(fast, "POST", "/networks", json={"name": "mine-net", "region": "dev-1",
                                                             "ip_range": "10.42.0.0/24"})
    ids = {"srv": server["id"], "job": job["id"], "tok": tok["token"]["id"], "adr": adr["address"]["id"],
           "lb": lb["load_balancer"]["id"], "k8s": k8s["cluster"]["id"], "vol": vol["volume"]["id"],
           "fw": fw["firewall"]["id"], "net": net["network"]["id"]}
    _, other = await make_tenant(fast.pool, "intruder")
    routes = sorted({(r.method, r.resource.canonical) for r in fast.app.router.routes()
                     if r.resource is not None and "{id}" in r.resource.canonical and r.method != "HEAD"})
    assert len(routes) >= 17, routes  # servers (9), jobs, tokens, addresses (6)
    before = await fast.pool.fetchval("SELECT count(*) FROM jobs"), await fast.pool.fetchval(
        "SELECT count(*) FROM api_tokens WHERE revoked_at IS NOT NULL")
    for method, template in routes:
        if template.startswith("/v1/operator/"):
            # the operator's routes (any tenant's jobs): a tenant's token lacks the scope, whatever the id
            status, out, _ = await call(fast, method, template.removeprefix("/v1").replace("{id}", job["id"]), other,
                                        json={} if method in ("POST", "PATCH") else None)
            assert status == 403 and out["error"]["code"] == "insufficient_scope", (method, template, status, out)
            continue
        prefix = {"servers": "srv", "jobs": "job", "tokens": "tok", "addresses": "adr", "load-balancers": "lb",
                  "clusters": "k8s", "volumes": "vol", "firewalls": "fw", "networks": "net",
                  "operator": "job"}[template.split("/")[2]]
        path = template.removeprefix("/v1").replace("{id}", ids[prefix])
        # a valid body for each action, so that only the id can make it fail
        action = template.rsplit("/", 1)[-1]
        bodies = {"assign": {"server_id": server["id"]}, "resize": {"disk_gib": 50},
                "add_target": {"type": "ip", "ip": "198.51.100.201"}, "remove_target": {"type": "ip", "ip": "198.51.100.201"},
                "add_service": {"protocol": "tcp", "listen_port": 81, "destination_port": 8081},
                "update_service": {"listen_port": 80, "destination_port": 9080},
                "delete_service": {"listen_port": 80}, "change_algorithm": {"type": "least_connections"},
                "add-node-pool": {"name": "more", "count": 1}, "resize-node-pool": {"pool": "workers", "count": 2},
                "remove-node-pool": {"pool": "workers"}, "rotate-credentials": {}}
        # the load balancers' kebab-case paths and their deprecated snake_case aliases take one body
        body = bodies[action] if action in bodies else bodies.get(action.replace("-", "_"), {"name": "taken-over"})
        if method == "PATCH" and prefix == "k8s":  # a cluster's name is fixed; its labels are not
            body = {"labels": {"taken": "over"}}
        if prefix == "vol" and action in ("resize", "attach", "detach"):  # a volume's own action bodies
            body = {"resize": {"size_gib": 20}, "attach": {"server_id": server["id"]}, "detach": {}}[action]
        if prefix == "fw" and method == "POST":  # a firewall's own action bodies (either spelling)
            body = {"set_rules": {"rules": []}, "apply_to_resources": {"apply_to": [{"server_id": server["id"]}]},
                    "remove_from_resources": {"remove_from": [{"server_id": server["id"]}]}}[action.replace("-", "_")]
        if prefix == "srv" and action.replace("-", "_") in ("attach_to_network", "detach_from_network"):
            body = {"network_id": net["network"]["id"]}  # this tenant's network: only the server's id can fail
        status, out, _ = await call(fast, method, path, other, json=body if method in ("POST", "PATCH") else None)
        if template.startswith("/v1/operator/"):  # the operator's views: a tenant's token never gets in
            assert status == 403 and out["error"]["code"] == "insufficient_scope", (method, path, status, out)
            continue
        assert status == 404, (method, path, status, out)
        assert out["error"]["code"] == "not_found"
    after = await fast.pool.fetchval("SELECT count(*) FROM jobs"), await fast.pool.fetchval(
        "SELECT count(*) FROM api_tokens WHERE revoked_at IS NOT NULL")
    assert before == after
    assert (await fast.server(server["id"]))["status"] == "creating"
    _, mine, _ = await call(fast, "GET", f"/addresses/{adr['address']['id']}")
    assert mine["address"]["name"] == "mine-a" and mine["address"]["status"] != "deleting"


async def test_address_job_details_hidden_from_tenants(fast: Stack, settings: Settings) -> None:
    """The redaction is not tied to a resource type: an address job's UPID reads `hidden` too."""
    status, out, _ = await call(fast, "POST", "/addresses", json={"region": REGION, "name": "up-a"})
    assert status == 202, out
    job = out["job"]
    claimed = await store.job_claim(fast.pool, [REGION], 10, "owner-x", 30)
    assert [c.id for c in claimed] == [job["id"]]
    lease = Lease(job["id"], "owner-x", claimed[0].attempt)
    account = settings.regions[REGION].token_id
    upid = f"UPID:pve1:0000A1B2:0012C3D4:6756A1B2:qmconfig:105:{account}:"
    await store.job_progress(fast.pool, lease, [{"name": "tag", "state": "running", "detail": {"upid": upid}}], 30)
    for path in (f"/jobs/{job['id']}", f"/jobs?resource_id={out['address']['id']}"):
        status, view, _ = await call(fast, "GET", path)
        assert status == 200, view
        assert account not in str(view) and "root@pam" not in str(view), path
        assert ":qmconfig:105:hidden:" in str(view), path


async def test_a_real_jobs_steps_hide_the_platform_account_from_tenants(stack: Stack, settings: Settings) -> None:
    """Issue 12 test 7 end to end: a server created through the executor against the simulator
    (UPIDs as Proxmox writes them, ``…:root@pam!z9:``); the tenant's view of its job (one job,
    the list, the long-poll) carries neither ``root@pam`` nor the token id; an operator token of
    the same tenant sees the UPIDs whole."""
    _, job = await stack.create_server("real-up-1")
    done = await stack.wait_job(job["id"], 60)
    assert done["status"] == "succeeded", done
    account = settings.regions[REGION].token_id
    user, _, token_name = account.partition("!")
    assert user == "root@pam" and token_name
    for path in (f"/jobs/{job['id']}", f"/jobs/{job['id']}?wait_s=1", "/jobs",
                 f"/jobs?resource_id={done['resource']['id']}"):
        status, view, _ = await call(stack, "GET", path)
        assert status == 200, view
        text = str(view)
        assert "root@pam" not in text and account not in text and f"!{token_name}" not in text, (path, text)
    upids = [s["detail"]["upid"] for s in done["steps"] if "upid" in (s.get("detail") or {})]
    assert upids and all(u.endswith(":hidden:") for u in upids), done["steps"]
    operator = "z9t_" + os.urandom(16).hex()
    await store.api_token_insert(stack.pool, stack.tenant_id, operator, "ops", scopes=("read", "operator"))
    status, op_view, _ = await call(stack, "GET", f"/jobs/{job['id']}", operator)
    assert status == 200
    op_upids = [s["detail"]["upid"] for s in op_view["steps"] if "upid" in (s.get("detail") or {})]
    assert op_upids and all(f":{account}:" in u for u in op_upids), op_upids
