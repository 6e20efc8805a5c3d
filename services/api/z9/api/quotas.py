"""Quotas per tenant: servers, cores, memory, addresses and load balancers (rows not yet deleted).

Limits: the ``Z9_QUOTA_*`` settings (None: no limit), overridden per tenant in ``tenant_quotas``
(``z9 quota``). :func:`check` runs in the transaction of the request that would add to the use,
before its writes: when a limit applies it takes the tenant's quota lock (an advisory
transaction lock) and counts; a request over a limit gets 403 ``quota_exceeded`` naming the
limit, the quota, the current use and what it asked for. The lock is held until commit, so a
second request of the tenant counts after the first one's rows are visible: two requests can
never both pass the last unit. A tenant without any limit takes no lock (creates stay parallel).
"""
from __future__ import annotations

from typing import Any

from aiohttp import web
from pydantic import Field

from z9.common import store
from z9.common.errors import Forbidden
from z9.common.settings import Settings

from . import schemas

UNITS = {"servers": "servers", "cores": "cores", "memory_mib": "MiB of memory", "addresses": "addresses",
         "load_balancers": "load balancers", "volume_gib": "GiB of volumes"}


async def limits(conn: Any, settings: Settings, tenant_id: str) -> dict[str, int | None]:
    """The tenant's effective limits (its override, else the setting; None: no limit)."""
    own = await store.tenant_quota_get(conn, tenant_id)
    return {k: own[k] if own[k] is not None else getattr(settings, f"quota_{k}") for k in store.QUOTA_KEYS}


async def check(conn: Any, settings: Settings, tenant_id: str, **adding: int) -> None:
    """Raise 403 ``quota_exceeded`` when adding ``adding`` (servers=, cores=, memory_mib=,
    addresses=) to the tenant's use passes a limit. ``conn`` must be in the request's
    transaction (the lock is released at its end)."""
    lim = await limits(conn, settings, tenant_id)
    relevant = {k: v for k, v in adding.items() if v > 0 and lim[k] is not None}
    if not relevant:
        return
    used = await store.tenant_quota_lock_usage(conn, tenant_id)
    for k, n in relevant.items():
        quota = lim[k]
        assert quota is not None
        if used[k] + n > quota:
            raise Forbidden(f"quota exceeded: {k} — this tenant may use {quota} {UNITS[k]}, uses {used[k]}, and the "
                            f"request needs {n} more; free some or ask the operator for a higher quota",
                            code="quota_exceeded",
                            details={"limit": k, "quota": quota, "used": used[k], "requested": n})


# ---------------------------------------------------------------------------------- GET /v1/quota

class QuotaUse(schemas.Response):
    """One quota: its limit (null: none) and the tenant's use."""

    limit: int | None = Field(description="the most the tenant may use (null: no limit)")
    used: int = Field(description="what the tenant's resources not yet deleted use now")


class QuotaSet(schemas.Response):
    servers: QuotaUse
    cores: QuotaUse = Field(description="servers' and cluster members' cores")
    memory_mib: QuotaUse = Field(description="servers' and cluster members' memory, MiB")
    addresses: QuotaUse = Field(description="addresses, load balancers' VIP and appliance addresses included")
    load_balancers: QuotaUse = Field(description="load balancers")
    volume_gib: QuotaUse = Field(description="the sizes of the tenant's volumes, GiB")


class TenantQuota(schemas.Response):
    """``GET /v1/quota``: the calling tenant's quotas (the operator sets them: ``z9 quota``)."""

    quotas: QuotaSet


async def get_quota(request: web.Request) -> web.Response:
    from .resources import POOL, SETTINGS, dump, tenant

    pool, settings, tenant_id = request.app[POOL], request.app[SETTINGS], tenant(request)
    async with pool.acquire() as conn:
        lim = await limits(conn, settings, tenant_id)
        used = await store.tenant_quota_usage(conn, tenant_id)
    return web.json_response(dump(TenantQuota, {"quotas": {k: {"limit": lim[k], "used": used[k]}
                                                          for k in store.QUOTA_KEYS}}))


def operation() -> Any:
    from .resources import Operation

    return Operation("GET", "/quota", get_quota, "getQuota", "Your tenant's quotas: each limit and the use",
                     "quota", {200: TenantQuota, 401: None},
                     example={"quotas": {"servers": {"limit": 10, "used": 2}, "cores": {"limit": None, "used": 4},
                                         "memory_mib": {"limit": None, "used": 4096},
                                         "addresses": {"limit": 5, "used": 1},
                                         "load_balancers": {"limit": 2, "used": 0},
                                         "volume_gib": {"limit": 1000, "used": 50}}})
