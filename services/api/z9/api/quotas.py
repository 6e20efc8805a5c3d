"""Quotas per tenant: the units every resource type declares on its registry entry (its slice's
``QuotaUnit``s), counted over rows not yet deleted by each type that counts toward them (its
slice's ``QuotaUsage`` query; a server's cores and a cluster member's add up). Nothing here names
a unit: the checks, ``GET /v1/quota`` and its OpenAPI shape are derived from the registry.

Limits: the ``Z9_QUOTA_<UNIT>`` settings (``quota_defaults``; absent: no limit), overridden per
tenant in ``tenant_quota_limits`` (``z9 quota``). :func:`check` runs in the transaction of the
request that would add to the use, before its writes: when a limit applies it takes the tenant's
quota lock (an advisory transaction lock) and counts; a request over a limit gets 403
``quota_exceeded`` naming the limit, the quota, the current use and what it asked for. The lock is
held until commit, so a second request of the tenant counts after the first one's rows are
visible: two requests can never both pass the last unit. A tenant without any limit takes no lock
(creates stay parallel).
"""
from __future__ import annotations

import functools
from typing import Any

from aiohttp import web
from pydantic import Field, create_model

from z9 import resources
from z9.common import store
from z9.common.errors import Forbidden
from z9.common.settings import Settings

from . import schemas


async def limits(conn: Any, settings: Settings, tenant_id: str) -> dict[str, int | None]:
    """The tenant's effective limits (its own, else the setting; None: no limit), every unit."""
    own = await store.tenant_quota_limits(conn, tenant_id)
    return {k: own.get(k, settings.quota_defaults.get(k)) for k in resources.quota_units()}


async def check(conn: Any, settings: Settings, tenant_id: str, **adding: int) -> None:
    """Raise 403 ``quota_exceeded`` when adding ``adding`` (``unit=n``, a registered unit each) to
    the tenant's use passes a limit. ``conn`` must be in the request's
    transaction (the lock is released at its end). Only the types counting toward the units
    asked for count (after the lock, each in a statement of its own)."""
    units = resources.quota_units()
    unknown = [k for k in adding if k not in units]
    if unknown:
        raise KeyError(f"no such quota: {unknown}")
    lim = await limits(conn, settings, tenant_id)
    relevant = {k: v for k, v in adding.items() if v > 0 and lim[k] is not None}
    if not relevant:
        return
    used = await resources.quota_usage(conn, tenant_id, relevant, lock=True)
    for k, n in relevant.items():
        quota = lim[k]
        assert quota is not None
        if used[k] + n > quota:
            raise Forbidden(f"quota exceeded: {k} — this tenant may use {quota} {units[k].unit}, uses {used[k]}, and "
                            f"the request needs {n} more; free some or ask the operator for a higher quota",
                            code="quota_exceeded",
                            details={"limit": k, "quota": quota, "used": used[k], "requested": n})


# ---------------------------------------------------------------------------------- GET /v1/quota

class QuotaUse(schemas.Response):
    """One quota: its limit (null: none) and the tenant's use."""

    limit: int | None = Field(description="the most the tenant may use (null: no limit)")
    used: int = Field(description="what the tenant's resources not yet deleted use now")


@functools.cache
def _models(units: tuple[str, ...]) -> tuple[type[schemas.Response], type[schemas.Response]]:
    fields: dict[str, Any] = {k: (QuotaUse, Field(description="the tenant's " + resources.quota_description(k))) for k in units}
    quota_set = create_model("QuotaSet", __base__=schemas.Response, __doc__="Every quota of the tenant, by unit.",
                             **fields)
    tenant_quota = create_model("TenantQuota", __base__=schemas.Response,
                                __doc__="``GET /v1/quota``: the calling tenant's quotas (the operator sets them: "
                                        "``z9 quota``).",
                                quotas=(quota_set, ...))
    return quota_set, tenant_quota


def tenant_quota_model() -> type[schemas.Response]:
    """``TenantQuota``: ``{"quotas": {<unit>: QuotaUse, …}}``, a property per registered unit."""
    return _models(tuple(resources.quota_units()))[1]


async def get_quota(request: web.Request) -> web.Response:
    from .resources import POOL, SETTINGS, dump, tenant

    pool, settings, tenant_id = request.app[POOL], request.app[SETTINGS], tenant(request)
    async with pool.acquire() as conn:
        lim = await limits(conn, settings, tenant_id)
        used = await resources.quota_usage(conn, tenant_id)
    return web.json_response(dump(tenant_quota_model(), {"quotas": {k: {"limit": lim[k], "used": used[k]}
                                                                    for k in resources.quota_units()}}))


def operation() -> Any:
    from .resources import Operation

    example = {k: {"limit": u.example[0], "used": u.example[1]} for k, u in resources.quota_units().items()}
    return Operation("GET", "/quota", get_quota, "getQuota", "Your tenant's quotas: each limit and the use",
                     "quota", {200: tenant_quota_model(), 401: None}, example={"quotas": example})
