"""The REST API alone (``api`` fixture: no executor, so jobs stay ``pending``): 202 shapes, auth,
validation, conflicts, tenant isolation, two-phase deletion and its cancellation, job listing,
Idempotency-Key, nothing half-written after a 4xx, and the NOTIFY that wakes executors."""
from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from typing import Any

import asyncpg
import pytest

from tests.support import REGION, Stack, make_tenant, wait_until

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIIMQ+ctuWvPKZcSiB0avvBJbVNptRfvJ+8krZNKKKLvo alice@example"


def body(**over: Any) -> dict[str, Any]:
    b: dict[str, Any] = {"name": "web-1", "region": REGION, "image": "debian-12", "cores": 2,
                         "memory_mib": 2048, "disk_gib": 10, "ssh_keys": [KEY]}
    b.update(over)
    return b


async def counts(api: Stack) -> tuple[int, int, int]:
    """(servers, jobs, idempotency keys) rows in the database."""
    return (await api.pool.fetchval("SELECT count(*) FROM servers"),
            await api.pool.fetchval("SELECT count(*) FROM jobs"),
            await api.pool.fetchval("SELECT count(*) FROM idempotency_keys"))


async def raw(api: Stack, method: str, path: str, *, headers: dict[str, str] | None = None,
              **kw: Any) -> tuple[int, Any, Any]:
    """A request with explicit headers; returns (status, json, response headers)."""
    async with api.http.request(method, api.base + path, headers=headers or {}, **kw) as r:
        return r.status, await r.json(), r.headers


def assert_error(out: Any, code: str, *words: str) -> str:
    assert set(out) == {"error"}, out
    err = out["error"]
    assert set(err) == {"code", "message", "details"}, err
    assert err["code"] == code, err
    for w in words:
        assert w in err["message"], (w, err)
    return err["message"]


async def db_now(api: Stack) -> datetime:
    return await api.pool.fetchval("SELECT now()")


def ts(v: str) -> datetime:
    return datetime.fromisoformat(v.replace("Z", "+00:00"))


# ---------------------------------------------------------------------------------- create

async def test_create_answers_202_and_writes_server_and_job(api: Stack) -> None:
    status, out = await api.call("POST", "/servers", json=body())
    assert status == 202, out
    assert set(out) == {"server", "job", "jobs"} and out["jobs"] == [out["job"]]  # one job: jobs is [job]
    srv, job = out["server"], out["job"]
    assert srv["id"].startswith("srv_") and srv["status"] == "creating"
    assert srv["name"] == "web-1" and srv["region"] == REGION and srv["image"] == "debian-12"
    assert (srv["cores"], srv["memory_mib"], srv["disk_gib"], srv["ssh_keys"]) == (2, 2048, 10, [KEY])
    assert srv["delete_after"] is None and srv["deleted_at"] is None
    assert job == {"id": job["id"], "kind": "ServerCreate", "status": "pending"}
    assert job["id"].startswith("job_")

    row = await api.pool.fetchrow("SELECT * FROM servers WHERE id = $1", srv["id"])
    assert row is not None
    assert row["tenant_id"] == api.tenant_id and row["status"] == "creating" and row["name"] == "web-1"
    jrow = await api.pool.fetchrow("SELECT * FROM jobs WHERE id = $1", job["id"])
    assert jrow is not None
    assert (jrow["kind"], jrow["status"], jrow["region"], jrow["tenant_id"], jrow["resource_type"],
            jrow["resource_id"]) == ("ServerCreate", "pending", REGION, api.tenant_id, "server", srv["id"])
    assert jrow["args"]["name"] == "web-1" and jrow["args"]["disk_gib"] == 10
    assert jrow["max_attempts"] == api.settings.max_attempts
    assert await counts(api) == (1, 1, 0)

    # GET answers the same server and job
    assert (await api.server(srv["id"]))["id"] == srv["id"]
    got = await api.job(job["id"])
    assert got["status"] == "pending" and got["kind"] == "ServerCreate"
    assert got["resource"] == {"type": "server", "id": srv["id"]}
    assert got["attempt"] == 0 and got["run_after"] is not None


# ---------------------------------------------------------------------------------- auth

@pytest.mark.parametrize("headers", [
    {},
    {"Authorization": "Bearer z9t_wrong-token"},
    {"Authorization": "Bearer "},
    {"Authorization": "Basic dXNlcjpwYXNz"},
    {"Authorization": "z9t_no_scheme"},
])
async def test_unauthorized(api: Stack, headers: dict[str, str]) -> None:
    for method, path, kw in (("GET", "/servers", {}), ("POST", "/servers", {"json": body()}),
                             ("GET", "/jobs", {})):
        status, out, _ = await raw(api, method, path, headers=headers, **kw)
        assert status == 401, out
        assert_error(out, "unauthorized")
    assert await counts(api) == (0, 0, 0)


async def test_revoked_token_is_unauthorized(api: Stack) -> None:
    await api.pool.execute("UPDATE api_tokens SET revoked_at = now()")
    status, out = await api.call("GET", "/servers")
    assert status == 401
    assert_error(out, "unauthorized")


# ---------------------------------------------------------------------------------- validation

INVALID: list[tuple[str, dict[str, Any], str]] = [
    ("missing name", {"name": None}, "name"),
    ("upper case name", {"name": "Web-1"}, "name"),
    ("underscore name", {"name": "web_1"}, "name"),
    ("64-char name", {"name": "a" * 64}, "name"),
    ("trailing-dash name", {"name": "web-"}, "name"),
    ("name with newline", {"name": "web-1\n"}, "name"),
    ("empty name", {"name": ""}, "name"),
    ("unknown field", {"colour": "blue"}, "colour"),
    ("cores 0", {"cores": 0}, "cores"),
    ("cores 65", {"cores": 65}, "cores"),
    ("cores string", {"cores": "2"}, "cores"),
    ("cores true", {"cores": True}, "cores"),
    ("cores float", {"cores": 2.5}, "cores"),
    ("memory too small", {"memory_mib": 256}, "memory_mib"),
    ("disk 0", {"disk_gib": 0}, "disk_gib"),
    ("missing disk", {"disk_gib": None}, "disk_gib"),
    ("unknown region", {"region": "mars-1"}, "region"),
    ("image not offered", {"image": "windows-11"}, "image"),
    ("ssh key garbage", {"ssh_keys": ["not a key"]}, "ssh_keys"),
    ("ssh key no body", {"ssh_keys": ["ssh-ed25519"]}, "ssh_keys"),
    ("ssh key two lines", {"ssh_keys": [KEY + "\n" + KEY]}, "ssh_keys"),
    ("ssh keys not a list", {"ssh_keys": KEY}, "ssh_keys"),
    # shaped like a key, but its blob is no key ssh-keygen reads (Proxmox refuses it: SSH public key
    # validation error), or its type is not the blob's
    ("ssh key unreadable", {"ssh_keys": ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDa8 alice@example"]}, "ssh_keys"),
    ("ssh key type not its blob's", {"ssh_keys": ["ssh-rsa " + KEY.split()[1]]}, "ssh_keys"),
    # a comment Proxmox's unquoted user-data line turns into YAML syntax
    ("ssh key comment a: b: c", {"ssh_keys": [KEY + " a: b: c"]}, "ssh_keys"),
    ("ssh key comment user: laptop", {"ssh_keys": [" ".join(KEY.split()[:2]) + " user: laptop"]}, "ssh_keys"),
    ("ssh key comment #", {"ssh_keys": [KEY + " #work"]}, "ssh_keys"),
]


@pytest.mark.parametrize("case,over,field", INVALID, ids=[c[0] for c in INVALID])
async def test_invalid_input_is_422_naming_the_field(api: Stack, case: str, over: dict[str, Any],
                                                     field: str) -> None:
    b = body(**{k: v for k, v in over.items() if v is not None})
    for k, v in over.items():
        if v is None:
            b.pop(k)
    status, out = await api.call("POST", "/servers", json=b)
    assert status == 422, (case, out)
    msg = assert_error(out, "validation_failed", field)
    assert msg.startswith("invalid request") or msg.startswith(field), msg
    assert any(d["field"] == field for d in out["error"]["details"]), out
    assert await counts(api) == (0, 0, 0)


async def test_a_whole_number_written_as_a_float_is_an_integer(api: Stack) -> None:
    """JSON Schema's ``integer`` is any number without a fraction: ``2048.0`` is the integer the
    document allows (schemathesis sent such bodies); ``2.5``, ``"2"`` and ``true`` stay 422."""
    status, out = await api.call("POST", "/servers", json=body(cores=2.0, memory_mib=2048.0, disk_gib=1e1))
    assert status == 202, out
    assert (out["server"]["cores"], out["server"]["memory_mib"], out["server"]["disk_gib"]) == (2, 2048, 10)
    assert isinstance(out["server"]["cores"], int)
    status, out = await api.call("POST", "/servers", json=body(name="big", cores=1e300))
    assert status == 422 and out["error"]["details"][0]["field"] == "cores", out


async def test_several_invalid_fields_are_all_named(api: Stack) -> None:
    status, out = await api.call("POST", "/servers", json=body(cores=0, memory_mib=1, name="X"))
    assert status == 422
    assert_error(out, "validation_failed", "cores", "memory_mib", "name")


@pytest.mark.parametrize("data", [b"{not json", b"", b"null", b"[1, 2]", b"42", b'"web-1"', b"\xff\xfe"])
async def test_non_json_or_non_object_body_is_400(api: Stack, data: bytes) -> None:
    status, out, _ = await raw(api, "POST", "/servers", data=data,
                               headers={**api.headers(), "Content-Type": "application/json"})
    assert status == 400, out
    assert_error(out, "bad_request")
    assert await counts(api) == (0, 0, 0)


@pytest.mark.parametrize("path", ["/servers?limit=0", "/jobs?limit=0", "/servers?limit=501", "/jobs?limit=-1",
                                  "/servers?limit=abc", "/jobs?limit="])
async def test_bad_limit_is_422(api: Stack, path: str) -> None:
    status, out = await api.call("GET", path)
    assert status == 422, out
    assert_error(out, "validation_failed", "limit")


async def test_superscript_limit_is_422_not_500(api: Stack) -> None:
    status, out = await api.call("GET", "/servers?limit=²")
    assert status == 422, out


async def test_ssh_keys_accepted_are_exactly_what_the_document_allows(api: Stack) -> None:
    """The document's pattern and the API agree on what may surround a key and on its length.
    It said ``\\s``, which each reader takes differently (ECMA-262 adds U+FEFF, schemathesis' Rust
    engine U+0085, Python's ``str.strip`` U+001C-U+001F too), and the API stripped before it
    measured: a key with U+001C around it, or padded past 16384 characters, was refused by the
    document and accepted (202) by the API (schemathesis' negative data)."""
    import re

    from z9.api.schemas import SSH_KEY_PATTERN

    accepted = [KEY, f" {KEY}\r\n", f"\t{KEY}\n", " " * (16384 - len(KEY)) + KEY]
    refused = [f"\x1c{KEY}", f"{KEY}\x1f", f"\x85{KEY}", f"\u00a0{KEY}", f"\ufeff{KEY}", f"\u2028{KEY}",
               f"\x0b{KEY}", " " * (16385 - len(KEY)) + KEY, KEY + "\n" * (16385 - len(KEY))]
    for i, key in enumerate(accepted + refused):
        ok = key in accepted
        assert bool(re.search(SSH_KEY_PATTERN, key)) and len(key) <= 16384 if ok else \
            not (re.search(SSH_KEY_PATTERN, key) and len(key) <= 16384), repr(key[:3])  # the document
        status, out = await api.call("POST", "/servers", json=body(name=f"k-{i}", ssh_keys=[key]))
        if ok:
            assert status == 202 and out["server"]["ssh_keys"] == [KEY], (repr(key[:3]), out)
        else:
            assert status == 422 and out["error"]["details"][0]["field"] == "ssh_keys", (repr(key[:3]), out)


async def test_nul_in_ssh_key_is_422_not_500(api: Stack) -> None:
    status, out = await api.call("POST", "/servers", json=body(ssh_keys=["ssh-ed25519 AAAA\u0000 a@b"]))
    assert status == 422, out
    assert await counts(api) == (0, 0, 0)


async def test_limit_is_honoured(api: Stack) -> None:
    for i in range(3):
        await api.create_server(f"web-{i}")
    status, out = await api.call("GET", "/servers?limit=2")
    assert status == 200 and len(out["servers"]) == 2
    status, rest = await api.call("GET", f"/servers?limit=2&after={out['next_after']}")
    assert status == 200 and len(rest["servers"]) == 1 and rest["next_after"] is None
    status, jobs = await api.call("GET", "/jobs?limit=1")
    assert status == 200 and len(jobs["jobs"]) == 1


async def test_status_filter(api: Stack) -> None:
    a, _ = await api.create_server("a-1")
    await api.create_server("b-1")
    await api.call("DELETE", f"/servers/{a['id']}")
    status, out = await api.call("GET", "/servers?status=deleting")
    assert status == 200 and [s["id"] for s in out["servers"]] == [a["id"]]
    status, out = await api.call("GET", "/servers?status=creating")
    assert status == 200 and len(out["servers"]) == 1
    status, out = await api.call("GET", "/servers?status=bogus")
    assert status == 422, out
    assert_error(out, "validation_failed", "status")


# ---------------------------------------------------------------------------------- conflicts

async def test_duplicate_name_is_409_naming_it(api: Stack) -> None:
    await api.create_server("dup-1")
    status, out = await api.call("POST", "/servers", json=body(name="dup-1", cores=4))
    assert status == 409, out
    assert_error(out, "uniqueness_error", "dup-1")  # the code every kind answers for a taken name
    assert await counts(api) == (1, 1, 0)
    # another name is fine; the same name in another tenant is fine
    await api.create_server("dup-2")
    _, token = await make_tenant(api.pool, "other")
    status, out = await api.call("POST", "/servers", json=body(name="dup-1"), token=token)
    assert status == 202, out
    assert await counts(api) == (3, 3, 0)


async def test_name_is_free_again_once_deleted(api: Stack) -> None:
    srv, _ = await api.create_server("reuse-1")
    await api.pool.execute("UPDATE servers SET status = 'deleted', deleted_at = now() WHERE id = $1", srv["id"])
    new, _ = await api.create_server("reuse-1")
    assert new["id"] != srv["id"]


# ---------------------------------------------------------------------------------- tenants

async def test_other_tenant_sees_nothing(api: Stack) -> None:
    srv, job = await api.create_server()
    _, token = await make_tenant(api.pool, "other")
    for path in (f"/servers/{srv['id']}", f"/jobs/{job['id']}"):
        status, out = await api.call("GET", path, token=token)
        assert status == 404, (path, out)
        assert_error(out, "not_found")
    status, out = await api.call("GET", "/servers", token=token)
    assert status == 200 and out["servers"] == [] and out["next_after"] is None
    status, out = await api.call("GET", "/jobs", token=token)
    assert status == 200 and out["jobs"] == []
    status, out = await api.call("GET", f"/jobs?resource_id={srv['id']}", token=token)
    assert status == 200 and out["jobs"] == []
    status, out = await api.call("GET", f"/jobs?after={job['id']}", token=token)
    assert status == 422, out
    # nor may it delete or un-delete it
    status, out = await api.call("DELETE", f"/servers/{srv['id']}", token=token)
    assert status == 404, out
    status, out = await api.call("POST", f"/servers/{srv['id']}/actions/cancel-deletion", token=token)
    assert status == 404, out
    assert (await api.server(srv["id"]))["status"] == "creating"
    assert await counts(api) == (1, 1, 0)
    # the owner still sees them
    status, out = await api.call("GET", "/servers")
    assert [s["id"] for s in out["servers"]] == [srv["id"]]


@pytest.mark.parametrize("path", ["/jobs/job_bogus", "/servers/srv_x", f"/servers/srv_{'0' * 26}",
                                  f"/jobs/job_{'0' * 26}", f"/servers/job_{'0' * 26}", "/nope"])
async def test_unknown_ids_are_404(api: Stack, path: str) -> None:
    status, out = await api.call("GET", path)
    assert status == 404, out
    assert_error(out, "not_found")


async def test_delete_unknown_server_is_404(api: Stack) -> None:
    for method, path in (("DELETE", "/servers/srv_x"), ("DELETE", f"/servers/srv_{'0' * 26}"),
                         ("POST", f"/servers/srv_{'0' * 26}/actions/cancel-deletion")):
        status, out = await api.call(method, path)
        assert status == 404, out
    assert await counts(api) == (0, 0, 0)


# ---------------------------------------------------------------------------------- deletion

async def test_delete_starts_the_buffer_and_stops_the_server(api: Stack) -> None:
    srv, _ = await api.create_server()
    before = await db_now(api)
    status, out = await api.call("DELETE", f"/servers/{srv['id']}")
    assert status == 202, out
    assert out["server"]["status"] == "deleting"
    assert out["job"]["kind"] == "ServerStop" and out["job"]["status"] == "pending"
    delete_after = ts(out["server"]["delete_after"])
    expected = before + timedelta(seconds=api.settings.deletion_buffer_s)
    assert api.settings.deletion_buffer_s == 600
    assert abs((delete_after - expected).total_seconds()) < 5
    row = await api.pool.fetchrow("SELECT * FROM servers WHERE id = $1", srv["id"])
    assert row["status"] == "deleting" and row["status_before_delete"] == "creating"
    jrow = await api.pool.fetchrow("SELECT * FROM jobs WHERE id = $1", out["job"]["id"])
    assert (jrow["kind"], jrow["resource_id"], jrow["status"]) == ("ServerStop", srv["id"], "pending")
    assert (await api.server(srv["id"]))["status"] == "deleting"

    # again: 409 naming the precondition, nothing written
    n = await counts(api)
    status, again = await api.call("DELETE", f"/servers/{srv['id']}")
    assert status == 409, again
    assert_error(again, "resource_deleting", "deleting")
    assert await counts(api) == n


@pytest.mark.parametrize("status_", ["destroying", "deleted"])
async def test_delete_in_a_final_state_is_409(api: Stack, status_: str) -> None:
    srv, _ = await api.create_server()
    await api.pool.execute(
        "UPDATE servers SET status = $2::server_status, deleted_at = CASE WHEN $2 = 'deleted' THEN now() END "
        "WHERE id = $1", srv["id"], status_)
    status, out = await api.call("DELETE", f"/servers/{srv['id']}")
    assert status == 409, out
    assert_error(out, "resource_deleting", status_ if status_ == "deleted" else "destroyed")


async def test_cancel_deletion_of_a_creating_server(api: Stack) -> None:
    srv, _ = await api.create_server()
    await api.call("DELETE", f"/servers/{srv['id']}")
    status, out = await api.call("POST", f"/servers/{srv['id']}/actions/cancel-deletion")
    assert status == 202, out
    assert out["server"]["status"] == "creating"
    assert out["server"]["delete_after"] is None
    # it was still being created: the creation goes on (a ServerCreate with the server's spec)
    assert out["job"]["kind"] == "ServerCreate" and out["job"]["status"] == "pending"
    job = await api.pool.fetchrow("SELECT args FROM jobs WHERE id = $1", out["job"]["id"])
    assert job["args"]["name"] == srv["name"] and job["args"]["disk_gib"] == srv["disk_gib"]
    row = await api.pool.fetchrow("SELECT * FROM servers WHERE id = $1", srv["id"])
    assert row["status"] == "creating" and row["delete_after"] is None


async def test_delete_and_cancel_cannot_queue_jobs_without_end(api: Stack) -> None:
    """While a server's jobs cannot run (no executor here), alternating DELETE and
    cancel-deletion stops with a 409 at Z9_MAX_LIVE_JOBS_PER_RESOURCE live jobs, and the refused
    request changes nothing."""
    srv, _ = await api.create_server()
    limit = api.settings.max_live_jobs_per_resource
    live = 1  # the create
    while live < limit:
        status, out = await api.call("DELETE", f"/servers/{srv['id']}")
        assert status == 202, out
        live += 1
        if live == limit:
            break
        status, out = await api.call("POST", f"/servers/{srv['id']}/actions/cancel-deletion")
        assert status == 202, out
        live += 1
    before = await api.pool.fetchrow("SELECT status, delete_after FROM servers WHERE id = $1", srv["id"])
    action = ("POST", f"/servers/{srv['id']}/actions/cancel-deletion") if before["status"] == "deleting" \
        else ("DELETE", f"/servers/{srv['id']}")
    status, out = await api.call(*action)
    assert status == 409 and f"{limit} jobs waiting or running" in out["error"]["message"], out
    assert out["error"]["code"] == "too_many_jobs", out
    after = await api.pool.fetchrow("SELECT status, delete_after FROM servers WHERE id = $1", srv["id"])
    assert after == before
    assert await api.pool.fetchval("SELECT count(*) FROM jobs WHERE resource_id = $1", srv["id"]) == limit


async def test_cancel_deletion_restores_a_running_server(api: Stack) -> None:
    srv, _ = await api.create_server()
    await api.pool.execute("UPDATE servers SET power_state = 'running', status = 'running' WHERE id = $1",
                           srv["id"])
    status, out = await api.call("DELETE", f"/servers/{srv['id']}")
    assert status == 202 and out["job"]["kind"] == "ServerStop"
    status, out = await api.call("POST", f"/servers/{srv['id']}/actions/cancel-deletion")
    assert status == 202, out
    assert out["server"]["status"] == "running"
    assert out["job"]["kind"] == "ServerStart"
    # jobs of the server, in submission order
    status, listed = await api.call("GET", f"/jobs?resource_id={srv['id']}")
    assert status == 200
    assert [j["kind"] for j in listed["jobs"]] == ["ServerCreate", "ServerStop", "ServerStart"]
    assert all(j["resource"] == {"type": "server", "id": srv["id"]} for j in listed["jobs"])
    # and it can be deleted again
    status, out = await api.call("DELETE", f"/servers/{srv['id']}")
    assert status == 202 and out["server"]["status"] == "deleting"


async def test_cancel_when_not_deleting_is_409(api: Stack) -> None:
    srv, _ = await api.create_server()
    n = await counts(api)
    status, out = await api.call("POST", f"/servers/{srv['id']}/actions/cancel-deletion")
    assert status == 409, out
    assert_error(out, "not_deleting", "not deleting")
    assert await counts(api) == n


async def test_cancel_after_the_buffer_expired_is_409(api: Stack) -> None:
    srv, _ = await api.create_server()
    await api.call("DELETE", f"/servers/{srv['id']}")
    await api.pool.execute("UPDATE servers SET delete_after = now() - interval '1 s' WHERE id = $1", srv["id"])
    n = await counts(api)
    status, out = await api.call("POST", f"/servers/{srv['id']}/actions/cancel-deletion")
    assert status == 409, out
    msg = assert_error(out, "deletion_expired", "buffer expired")
    assert "cannot be cancelled" in msg or "no longer" in msg
    assert await counts(api) == n
    assert (await api.pool.fetchval("SELECT status FROM servers WHERE id = $1", srv["id"])) == "deleting"

    await api.pool.execute("UPDATE servers SET status = 'destroying' WHERE id = $1", srv["id"])
    status, out = await api.call("POST", f"/servers/{srv['id']}/actions/cancel-deletion")
    assert status == 409, out
    assert_error(out, "deletion_expired", "buffer has expired")


# ---------------------------------------------------------------------------------- jobs

async def test_jobs_listed_by_resource_in_order(api: Stack) -> None:
    a, ja = await api.create_server("a-1")
    b, jb = await api.create_server("b-1")
    stop1 = (await api.call("DELETE", f"/servers/{a['id']}"))[1]["job"]
    restore = (await api.call("POST", f"/servers/{a['id']}/actions/cancel-deletion"))[1]["job"]
    stop2 = (await api.call("DELETE", f"/servers/{a['id']}"))[1]["job"]
    assert [stop1["kind"], restore["kind"], stop2["kind"]] == ["ServerStop", "ServerCreate", "ServerStop"]
    status, out = await api.call("GET", f"/jobs?resource_id={a['id']}")
    assert status == 200
    assert [j["id"] for j in out["jobs"]] == [ja["id"], stop1["id"], restore["id"], stop2["id"]]
    assert out["next_after"] is None  # the last page
    status, out = await api.call("GET", f"/jobs?resource_id={b['id']}")
    assert [j["id"] for j in out["jobs"]] == [jb["id"]]
    # paging with after
    status, out = await api.call("GET", f"/jobs?resource_id={a['id']}&after={stop1['id']}&limit=1")
    assert status == 200 and [j["id"] for j in out["jobs"]] == [restore["id"]]
    # all jobs of the tenant, in order
    status, out = await api.call("GET", "/jobs")
    assert [j["id"] for j in out["jobs"]] == [ja["id"], jb["id"], stop1["id"], restore["id"], stop2["id"]]
    status, out = await api.call("GET", "/jobs?after=job_bogus")
    assert status == 422
    assert_error(out, "validation_failed", "after")


# ---------------------------------------------------------------------------------- idempotency

async def test_idempotency_key_replays(api: Stack) -> None:
    h = {**api.headers(), "Idempotency-Key": "req-1"}
    s1, o1, h1 = await raw(api, "POST", "/servers", json=body(), headers=h)
    # same body, keys in another order and with surrounding white space in the ssh key
    b2 = dict(reversed(list(body(ssh_keys=["  " + KEY + " "]).items())))
    s2, o2, h2 = await raw(api, "POST", "/servers", json=b2, headers=h)
    assert s1 == s2 == 202, (o1, o2)
    assert o2["server"]["id"] == o1["server"]["id"]
    assert o2["job"]["id"] == o1["job"]["id"]
    assert h2.get("Idempotent-Replayed") == "true" and "Idempotent-Replayed" not in h1
    assert await counts(api) == (1, 1, 1)

    # same key, different body: 422, nothing written
    s3, o3, _ = await raw(api, "POST", "/servers", json=body(cores=4), headers=h)
    assert s3 == 422, o3
    assert_error(o3, "validation_failed", "Idempotency-Key")
    s4, o4, _ = await raw(api, "POST", "/servers", json=body(name="web-2"), headers=h)
    assert s4 == 422, o4
    assert await counts(api) == (1, 1, 1)

    # a new key is a new request (a duplicate name here)
    s5, o5, _ = await raw(api, "POST", "/servers", json=body(), headers={**api.headers(), "Idempotency-Key": "req-2"})
    assert s5 == 409, o5
    assert await counts(api) == (1, 1, 1)


async def test_idempotency_keys_are_per_tenant(api: Stack) -> None:
    _, token = await make_tenant(api.pool, "other")
    s1, o1, _ = await raw(api, "POST", "/servers", json=body(), headers={**api.headers(), "Idempotency-Key": "k"})
    s2, o2, _ = await raw(api, "POST", "/servers", json=body(cores=4),
                          headers={**api.headers(token), "Idempotency-Key": "k"})
    assert s1 == s2 == 202, (o1, o2)
    assert o1["server"]["id"] != o2["server"]["id"]
    assert await counts(api) == (2, 2, 2)


@pytest.mark.parametrize("key", ["", "k" * 256])
async def test_bad_idempotency_key_is_400(api: Stack, key: str) -> None:
    status, out, _ = await raw(api, "POST", "/servers", json=body(), headers={**api.headers(), "Idempotency-Key": key})
    assert status == 400, out
    assert_error(out, "bad_request", "Idempotency-Key")
    assert await counts(api) == (0, 0, 0)


async def test_concurrent_retries_with_one_idempotency_key_both_succeed(api: Stack) -> None:
    h = {**api.headers(), "Idempotency-Key": "same-request"}
    blocker = await asyncpg.connect(api.settings.database_url)
    try:
        # Hold the jobs table so the first request stops right after inserting its server, with its
        # idempotency key not yet written; the retry arrives meanwhile (a client timing out and retrying).
        tx = blocker.transaction()
        await tx.start()
        await blocker.execute("LOCK TABLE jobs IN ACCESS EXCLUSIVE MODE")
        # The requests get new connections (as under load, when the pool's are busy elsewhere):
        # backends that start after this transaction did. pg_stat_activity is read once per
        # transaction (a snapshot kept to its end: it never shows them), pg_locks live each time:
        # the waits are read from pg_locks alone: one request on the jobs table, the other on
        # the key's advisory lock.
        await api.pool.expire_connections()
        t1 = asyncio.create_task(raw(api, "POST", "/servers", json=body(), headers=h))
        t2 = asyncio.create_task(raw(api, "POST", "/servers", json=body(), headers=h))

        async def both_waiting() -> bool:
            return await blocker.fetchval(
                "SELECT count(*) FILTER (WHERE locktype = 'relation' AND relation = 'jobs'::regclass) = 1 "
                "AND count(*) FILTER (WHERE locktype = 'advisory') = 1 FROM pg_locks WHERE NOT granted "
                "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())")
        await wait_until(both_waiting, 60, "both requests waiting on the held lock", interval_s=0.02)
        await tx.commit()
        (s1, o1, _), (s2, o2, _) = await asyncio.wait_for(asyncio.gather(t1, t2), 60)
    finally:
        await blocker.close()
    assert s1 == 202 and s2 == 202, (s1, o1, s2, o2)
    assert o1["server"]["id"] == o2["server"]["id"] and o1["job"]["id"] == o2["job"]["id"]
    assert await counts(api) == (1, 1, 1)


# ---------------------------------------------------------------------------------- nothing half-written

async def test_no_half_writes_after_4xx(api: Stack) -> None:
    srv, _ = await api.create_server("keep-1")
    base = await counts(api)
    attempts: list[tuple[str, str, dict[str, Any]]] = [
        ("POST", "/servers", {"json": body(name="keep-1")}),                  # 409 duplicate
        ("POST", "/servers", {"json": body(name="Bad")}),                     # 422
        ("POST", "/servers", {"json": body(region="nowhere")}),               # 422
        ("POST", "/servers", {"data": b"{"}),                                 # 400
        ("POST", f"/servers/{srv['id']}/actions/cancel-deletion", {}),        # 409 not deleting
        ("DELETE", "/servers/srv_x", {}),                                     # 404
    ]
    for method, path, kw in attempts:
        status, out = await api.call(method, path, **kw)
        assert 400 <= status < 500, (method, path, out)
        assert await counts(api) == base, (method, path)
    row = await api.pool.fetchrow("SELECT status, delete_after FROM servers WHERE id = $1", srv["id"])
    assert row["status"] == "creating" and row["delete_after"] is None


# ---------------------------------------------------------------------------------- NOTIFY

async def test_create_notifies_the_region(api: Stack) -> None:
    got: asyncio.Queue[str] = asyncio.Queue()
    listener = await asyncpg.connect(api.settings.database_url)
    try:
        await listener.add_listener("z9_jobs", lambda _c, _pid, _ch, payload: got.put_nowait(payload))
        await api.create_server()
        assert await asyncio.wait_for(got.get(), 5) == REGION
        # a rejected request (rolled back) notifies nobody
        status, _ = await api.call("POST", "/servers", json=body())
        assert status == 409
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(got.get(), 0.3)
        # a deletion enqueues a job: notified too
        status, out = await api.call("GET", "/servers")
        await api.call("DELETE", f"/servers/{out['servers'][0]['id']}")
        assert await asyncio.wait_for(got.get(), 5) == REGION
    finally:
        await listener.close()


async def test_openapi_document_is_valid_and_covers_every_route(api: Stack) -> None:
    from openapi_spec_validator import validate

    async with api.http.get(api.base + "/openapi.json") as r:  # no token needed
        assert r.status == 200
        doc = await r.json()
    validate(doc)
    routes: set[tuple[str, str]] = set()
    documented = {(p, m) for p, ops in doc["paths"].items() for m in ops}
    from z9.api.app import create_app

    for route in create_app(api.settings, pool=api.pool).router.routes():
        path = route.resource.canonical
        if path.startswith("/v1/") and path != "/v1/openapi.json" and route.method != "HEAD":
            routes.add((path[3:], route.method.lower()))
    assert routes == documented


async def test_hostile_input_is_4xx_never_500(api: Stack) -> None:
    cases = [
        ("POST", "/servers", {"data": b"[" * 100_000, "headers": {"Content-Type": "application/json"}}),
        ("GET", "/servers?after=a%00b", {}),
        ("GET", "/servers?after=srv_bogus", {}),
        ("GET", "/jobs?resource_id=a%00b", {}),
        ("POST", "/servers", {"json": {"name": "web-9", "region": "dev-1", "image": "debian-12", "cores": 1,
                                       "memory_mib": 1024, "disk_gib": 4, "ssh_keys": ["ssh-rsa \ud800 x"]}}),
        ("POST", "/servers", {"json": {"name": "web-9", "region": "dev-1", "image": "debian-12", "cores": 1,
                                       "memory_mib": 1024, "disk_gib": 4, "ssh_keys": ["ssh-rsa AAAA x\ry"]}}),
    ]
    for method, path, kw in cases:
        async with api.http.request(method, api.base + path, headers={**api.headers(), **kw.pop("headers", {})},
                                    **kw) as r:
            body = await r.json()
            assert 400 <= r.status < 500, (path, r.status, body)
            assert body["error"]["message"]
    async with api.http.get(api.base + "/servers", headers={"Authorization": "Bearer z9t_\u00e9"}) as r:
        assert r.status == 401
    assert await api.pool.fetchval("SELECT count(*) FROM servers") == 0


async def test_cancel_deletion_with_idempotency_key_replays(api: Stack) -> None:
    srv, _ = await api.create_server()
    assert (await api.call("DELETE", f"/servers/{srv['id']}"))[0] == 202
    path = f"/servers/{srv['id']}/actions/cancel-deletion"
    first = await api.call("POST", path, headers={"Idempotency-Key": "cancel-1"})
    again = await api.call("POST", path, headers={"Idempotency-Key": "cancel-1"})
    assert first[0] == again[0] == 202 and first[1]["job"]["id"] == again[1]["job"]["id"]
    assert (await api.call("POST", path))[0] == 409  # without the key: nothing to cancel any more
    n = await api.pool.fetchval("SELECT count(*) FROM jobs WHERE resource_id = $1", srv["id"])
    assert n == 3  # create, stop, one restoring job
