"""The cluster type's store: one typed wrapper per named query of its ``queries.sql``, asyncpg's
errors translated as in :mod:`z9.common.store` (the error boundary)."""
from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

import asyncpg

from z9.resources.cluster.model import Cluster
from z9.common.sql import q
from z9.common.store import DB, translate_errors

log = logging.getLogger("z9.store")


async def cluster_insert(db: DB, *, cluster_id: str, tenant_id: str, region: str, name: str, version: str,
                         image: str, control_plane: dict[str, Any], node_pools: list[dict[str, Any]],
                         endpoint_address_id: str | None, endpoint_ip: Any,
                         labels: dict[str, str] | None = None) -> Cluster:
    """A new ``creating`` cluster. Raises UniqueViolation (clusters_tenant_name_live)."""
    row = await db.fetchrow(q("cluster_insert"), cluster_id, tenant_id, region, name, version, image, control_plane,
                            node_pools, endpoint_address_id, endpoint_ip, labels or {})
    return Cluster.from_record(row)


async def cluster_set_labels(db: DB, cluster_id: str, tenant_id: str, labels: dict[str, str]) -> Cluster | None:
    """New labels (replacing all); None when absent, another tenant's or deleted."""
    row = await db.fetchrow(q("cluster_set_labels"), cluster_id, tenant_id, labels)
    return Cluster.from_record(row) if row else None


async def cluster_keys_insert(db: DB, cluster_id: str, key_id: str, nonce: bytes, sealed: bytes) -> None:
    """The cluster's sealed PKI."""
    await db.execute(q("cluster_keys_insert"), cluster_id, key_id, nonce, sealed)


async def cluster_keys_get(db: DB, cluster_id: str) -> tuple[str, bytes, bytes] | None:
    """``(key_id, nonce, sealed)`` of the cluster's PKI, or None (destroyed)."""
    row = await db.fetchrow(q("cluster_keys_get"), cluster_id)
    return (row["key_id"], bytes(row["nonce"]), bytes(row["sealed"])) if row else None


async def cluster_keys_get_for_update(conn: asyncpg.Connection, cluster_id: str) -> tuple[str, bytes, bytes] | None:
    """As :func:`cluster_keys_get`, the row locked (in the caller's transaction)."""
    row = await conn.fetchrow(q("cluster_keys_get_for_update"), cluster_id)
    return (row["key_id"], bytes(row["nonce"]), bytes(row["sealed"])) if row else None


async def cluster_keys_rotate(conn: asyncpg.Connection, cluster_id: str, key_id: str, nonce: bytes,
                              sealed: bytes) -> Any:
    """Write the cluster's PKI with a new users' client CA; when (kubeconfigs minted before: untrusted)."""
    return await conn.fetchval(q("cluster_keys_rotate"), cluster_id, key_id, nonce, sealed)


async def cluster_credential_insert(db: DB, *, serial: str, cluster_id: str, tenant_id: str, token_id: str | None,
                                    username: str, expires_at: datetime) -> dict[str, Any]:
    """Record a minted kubeconfig."""
    return dict(await db.fetchrow(q("cluster_credential_insert"), serial, cluster_id, tenant_id, token_id,
                                  username, expires_at))


async def cluster_credential_list(db: DB, cluster_id: str, tenant_id: str, limit: int = 100) -> list[dict[str, Any]]:
    """The kubeconfigs minted for the tenant's cluster, newest first, with ``trusted``."""
    return [dict(r) for r in await db.fetch(q("cluster_credential_list"), cluster_id, tenant_id, limit)]


async def cluster_keys_destroy(db: DB, cluster_id: str) -> bool:
    """Delete the cluster's keys (the delete's finishing transaction); True when there were some."""
    return await db.fetchrow(q("cluster_keys_destroy"), cluster_id) is not None


async def cluster_endpoint_activate(db: DB, address_id: str) -> None:
    """The endpoint address: active, protected against deletion through /v1/addresses."""
    await db.execute(q("cluster_endpoint_activate"), address_id)


async def cluster_endpoint_release(db: DB, cluster_id: str) -> list[str]:
    """Delete the cluster's endpoint address and quarantine its IP; the address ids released."""
    return [r["id"] for r in await db.fetch(q("cluster_endpoint_release"), cluster_id)]


async def cluster_get_for_update(db: DB, cluster_id: str, tenant_id: str) -> Cluster | None:
    """The tenant's cluster, its row locked until commit."""
    row = await db.fetchrow(q("cluster_get_for_update"), cluster_id, tenant_id)
    return Cluster.from_record(row) if row else None


async def cluster_set_shape(db: DB, cluster_id: str, node_pools: list[dict[str, Any]]) -> Cluster:
    """The cluster's new node pools; status ``updating``."""
    return Cluster.from_record(await db.fetchrow(q("cluster_set_shape"), cluster_id, node_pools))


async def cluster_members(db: DB, cluster_id: str, members: list[dict[str, Any]], whole: bool) -> Cluster | None:
    """Record the members a converge saw; ``whole``: every desired member was a Ready node."""
    row = await db.fetchrow(q("cluster_members"), cluster_id, members, whole)
    return Cluster.from_record(row) if row else None


async def cluster_degraded_reason(db: DB, cluster_id: str, reason: str) -> None:
    """The reason of a ``degraded`` cluster (what an observation found not Ready)."""
    await db.execute(q("cluster_degraded_reason"), cluster_id, reason)


async def cluster_degraded(db: DB, cluster_id: str, reason: str) -> None:
    """A failed reconcile of a once-whole cluster: ``degraded`` with the reason."""
    await db.execute(q("cluster_degraded"), cluster_id, reason)


translate_errors(globals(), __name__)
