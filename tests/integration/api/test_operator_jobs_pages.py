"""GET /v1/operator/jobs a page at a time: every tenant's jobs in the operator's order (retrying,
pending, running — each oldest first — then the finished ones, newest first) across pages of any
size, each job once, with ``next_after`` page tokens that only this list takes; each job and each
waiting tenant named by its tenant's name as well as its id."""
from __future__ import annotations

import secrets

from z9.common import store
from z9.common.store import Lease, NewJob

from tests.support import REGION, Stack, make_tenant

TTL = 30.0


async def _jobs(api: Stack) -> dict[str, str]:
    """Jobs of two tenants and of z9 itself in every status: {job id: tenant name or ''}."""
    pool = api.pool
    globex, _ = await make_tenant(pool, "globex")
    owners = {api.tenant_id: "acme", globex: "globex", None: ""}
    made: dict[str, str] = {}
    for tenant in (api.tenant_id, globex, None, api.tenant_id, globex, api.tenant_id, globex, None, api.tenant_id):
        job = await store.job_insert(pool, NewJob(kind="Noop", region=REGION, tenant_id=tenant))
        made[job.id] = owners[tenant]
    running = await store.job_claim(pool, [REGION], 6, "w", TTL)
    assert len(running) == 6
    await store.job_succeed(pool, Lease(running[0].id, "w", running[0].attempt), [])
    await store.job_succeed(pool, Lease(running[1].id, "w", running[1].attempt), [])
    await store.job_fail(pool, Lease(running[2].id, "w", running[2].attempt), [], {"class": "permanent", "message": "no"})
    await store.job_retry(pool, Lease(running[3].id, "w", running[3].attempt), [], {"class": "temporary", "message": "later"},
                          3600)
    return made  # 2 succeeded, 1 failed, 1 retry, 2 running, 3 pending


async def _operator(api: Stack) -> str:
    op = "z9t_" + secrets.token_urlsafe(24)
    await store.api_token_insert(api.pool, api.tenant_id, op, "ops", scopes=["read", "operator"])
    return op


async def test_operator_jobs_page_by_page_in_order_each_once_with_tenant_names(api: Stack) -> None:
    made = await _jobs(api)
    op = await _operator(api)
    status, whole = await api.call("GET", "/operator/jobs?limit=500", token=op)
    assert status == 200 and whole["next_after"] is None, whole
    order = [j["id"] for j in whole["jobs"]]
    assert set(order) == set(made)
    statuses = [j["status"] for j in whole["jobs"]]
    assert statuses[:6] == ["retry", "pending", "pending", "pending", "running", "running"], statuses
    finished = [j for j in whole["jobs"] if j["status"] in ("succeeded", "failed")]
    assert [j["created_at"] for j in finished] == sorted((j["created_at"] for j in finished), reverse=True)
    for j in whole["jobs"]:
        assert j["tenant_name"] == (made[j["id"]] or None), j
    for size in (1, 2, 4):
        seen: list[str] = []
        after = None
        while True:
            status, page = await api.call("GET", f"/operator/jobs?limit={size}" + (f"&after={after}" if after else ""),
                                          token=op)
            assert status == 200, page
            assert len(page["jobs"]) <= size
            seen += [j["id"] for j in page["jobs"]]
            after = page["next_after"]
            if after is None:
                break
            assert after.startswith("pg_") and len(seen) <= len(made)
        assert seen == order, (size, seen, order)
    # filtered pages page on within the filter
    status, first = await api.call("GET", "/operator/jobs?limit=1&status=pending", token=op)
    status, second = await api.call("GET", f"/operator/jobs?limit=5&status=pending&after={first['next_after']}",
                                    token=op)
    assert status == 200 and [j["id"] for j in first["jobs"] + second["jobs"]] == order[1:4]


async def test_operator_page_tokens_are_this_lists_own(api: Stack) -> None:
    await _jobs(api)
    op = await _operator(api)
    status, tenant_page = await api.call("GET", "/jobs?limit=1")
    assert status == 200 and tenant_page["next_after"]
    status, out = await api.call("GET", f"/operator/jobs?limit=1&after={tenant_page['next_after']}", token=op)
    assert status == 422 and out["error"]["details"][0]["field"] == "after", out
    status, op_page = await api.call("GET", "/operator/jobs?limit=1", token=op)
    assert status == 200 and op_page["next_after"]
    status, out = await api.call("GET", f"/jobs?after={op_page['next_after']}")
    assert status == 422 and out["error"]["details"][0]["field"] == "after", out
    status, out = await api.call("GET", "/operator/jobs?after=pg_" + "A" * 22, token=op)
    assert status == 422, out


async def test_operator_regions_and_a_job_name_the_tenant(api: Stack) -> None:
    made = await _jobs(api)
    op = await _operator(api)
    status, out = await api.call("GET", "/operator/regions", token=op)
    assert status == 200, out
    (region,) = [r for r in out["regions"] if r["name"] == REGION]
    assert {t["tenant_name"] for t in region["tenants"]} == {"acme", "globex", None}, region["tenants"]
    job_id = next(i for i, name in made.items() if name == "globex")
    status, detail = await api.call("GET", f"/operator/jobs/{job_id}", token=op)
    assert status == 200 and detail["job"]["tenant_name"] == "globex", detail
    assert all(h["tenant_name"] == "globex" for h in detail["history"])



async def test_a_jobs_history_holds_it_on_a_resource_with_many_observes(api: Stack) -> None:
    """A long-lived resource: one job asked for, then more periodic observe-only jobs than a
    history holds, then more asked-for jobs than it holds. The first job's history has the job
    itself, no observe, and the newest jobs, oldest first."""
    from z9.common import kinds

    observe = sorted(kinds.observe_only())[0]
    rid = "srv_" + "0" * 26

    async def job(kind: str) -> str:
        return (await store.job_insert(api.pool, NewJob(kind=kind, region=REGION, tenant_id=api.tenant_id,
                                                        resource_type="server", resource_id=rid))).id

    first = await job("Noop")
    for _ in range(510):
        await job(observe)
    asked = [await job("Noop") for _ in range(505)]
    op = await _operator(api)
    status, detail = await api.call("GET", f"/operator/jobs/{first}", token=op)
    assert status == 200, detail
    ids = [h["id"] for h in detail["history"]]
    assert first in ids and all(h["kind"] != observe for h in detail["history"]), ids[:3]
    assert ids[-1] == asked[-1] and ids[0] == first and len(ids) == 501, (len(ids), ids[:2], ids[-2:])
    status, detail = await api.call("GET", f"/operator/jobs/{asked[-1]}", token=op)
    assert status == 200 and detail["history"][-1]["id"] == asked[-1] and len(detail["history"]) == 500


async def test_operator_jobs_filter_by_a_tenants_name_too(api: Stack) -> None:
    """``?tenant=`` takes the name operators see as well as the id; an unknown one is a 422 naming
    the field."""
    made = await _jobs(api)
    op = await _operator(api)
    by_id = await api.call("GET", f"/operator/jobs?tenant={api.tenant_id}&limit=500", token=op)
    by_name = await api.call("GET", "/operator/jobs?tenant=acme&limit=500", token=op)
    assert by_id[0] == by_name[0] == 200, by_name
    ids = [j["id"] for j in by_name[1]["jobs"]]
    assert ids == [j["id"] for j in by_id[1]["jobs"]] and set(ids) >= {i for i, n in made.items() if n == "acme"}
    status, out = await api.call("GET", "/operator/jobs?tenant=no-such-tenant", token=op)
    assert status == 422 and out["error"]["details"][0]["field"] == "tenant", out
