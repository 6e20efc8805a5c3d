-- The cluster type's SQL (its tables), loaded with every other named query by z9.common.sql; called
-- through its store (z9.resources.cluster.store).

-- ================================================================ clusters (issue 11, migration 0009)

-- name: cluster_insert
INSERT INTO clusters (id, tenant_id, region, name, version, image, control_plane, node_pools,
                      endpoint_address_id, endpoint_ip, labels)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
RETURNING *;

-- name: cluster_set_labels
-- PATCH: database only (labels replace all of them); not once the cluster is deleted.
UPDATE clusters SET labels = $3, updated_at = now()
WHERE id = $1 AND tenant_id = $2 AND status <> 'deleted'
RETURNING *;

-- name: cluster_keys_insert
INSERT INTO cluster_keys (cluster_id, key_id, nonce, sealed) VALUES ($1, $2, $3, $4);

-- name: cluster_keys_get
SELECT key_id, nonce, sealed FROM cluster_keys WHERE cluster_id = $1;

-- name: cluster_keys_get_for_update
-- A credentials rotation: the sealed PKI, locked until the new one is written.
SELECT key_id, nonce, sealed FROM cluster_keys WHERE cluster_id = $1 FOR UPDATE;

-- name: cluster_keys_rotate
-- The sealed PKI with a new users' client CA; kubeconfigs minted before now are no longer trusted
-- (migration 0015).
UPDATE cluster_keys SET key_id = $2, nonce = $3, sealed = $4, client_ca_rotated_at = now()
WHERE cluster_id = $1
RETURNING client_ca_rotated_at;

-- name: cluster_credential_insert
-- A minted kubeconfig's record (who, when, until when, its certificate's serial).
INSERT INTO cluster_credentials (serial, cluster_id, tenant_id, token_id, username, expires_at)
VALUES ($1, $2, $3, $4, $5, $6)
RETURNING serial, token_id, username, created_at, expires_at;

-- name: cluster_credential_list
-- The kubeconfigs minted for cluster $1 of tenant $2, newest first (at most $3). trusted: not
-- expired, the cluster's keys not destroyed, and minted after the last client-CA rotation.
SELECT c.serial, c.token_id, c.username, c.created_at, c.expires_at,
       (c.expires_at > now() AND k.cluster_id IS NOT NULL
        AND (k.client_ca_rotated_at IS NULL OR c.created_at > k.client_ca_rotated_at)) AS trusted
FROM cluster_credentials c LEFT JOIN cluster_keys k ON k.cluster_id = c.cluster_id
WHERE c.cluster_id = $1 AND c.tenant_id = $2
ORDER BY c.created_at DESC, c.serial
LIMIT $3;

-- name: cluster_keys_destroy
-- The delete's finishing transaction: the keys are gone with the cluster.
DELETE FROM cluster_keys WHERE cluster_id = $1 RETURNING cluster_id;

-- name: cluster_endpoint_activate
-- The endpoint address is the cluster's from its allocation: active at once (no job of its own),
-- protected against deletion through /v1/addresses.
UPDATE addresses SET status = 'active', protect_delete = true, observed_at = now(), updated_at = now()
WHERE id = $1
RETURNING id;

-- name: cluster_endpoint_release
-- The delete's finishing transaction: the endpoint address is deleted and its IP goes back to its
-- pool, quarantined (straight to deleted: the address's own deletion rules are for addresses the
-- tenant holds; this one was the cluster's).
WITH gone AS (
    UPDATE addresses SET status = 'deleted', deleted_at = now(), protect_delete = false, server_id = NULL,
                         status_reason = NULL, observed_at = now(), updated_at = now()
    WHERE id = (SELECT endpoint_address_id FROM clusters WHERE id = $1) AND status <> 'deleted'
    RETURNING id
)
UPDATE address_pool_ips i
SET address_id = NULL, reusable_after = now() + make_interval(secs => p.quarantine_s)
FROM address_pools p, gone
WHERE i.address_id = gone.id AND p.id = i.pool_id
RETURNING gone.id;

-- name: cluster_get_for_update
SELECT * FROM clusters WHERE id = $1 AND tenant_id = $2 FOR UPDATE;

-- name: cluster_set_shape
-- A node-pool change: the new desired shape; the cluster is 'updating' until its reconcile ends.
UPDATE clusters SET node_pools = $2, status = 'updating', status_reason = NULL, updated_at = now()
WHERE id = $1
RETURNING *;

-- name: cluster_members
-- What a converge saw: its members; $3 the cluster was whole (every desired member a Ready node).
UPDATE clusters
SET members = $2, observed_at = now(), updated_at = now(),
    initialized_at = CASE WHEN $3 AND initialized_at IS NULL THEN now() ELSE initialized_at END
WHERE id = $1 AND status NOT IN ('deleted')
RETURNING *;

-- name: cluster_degraded
-- A failed reconcile of a cluster that was whole once: degraded (not failed), with the reason.
UPDATE clusters SET status = 'degraded', status_reason = $2, updated_at = now()
WHERE id = $1 AND status NOT IN ('deleting', 'destroying', 'deleted')
RETURNING id;

-- name: cluster_degraded_reason
-- What an observation found missing, on a cluster it left degraded.
UPDATE clusters SET status_reason = $2 WHERE id = $1 AND status = 'degraded';

-- name: cluster_quota_usage
-- The tenant's clusters' part of its quota use (after tenant_quota_lock, in a new statement): the
-- cores and memory of their members as asked for (every control plane and every pool member is a
-- VM of the tenant's), clusters not yet deleted.
WITH members AS (
    SELECT (c.control_plane->>'count')::bigint * (c.control_plane->>'cores')::bigint
             + coalesce((SELECT sum((p->>'count')::bigint * (p->>'cores')::bigint)
                         FROM jsonb_array_elements(c.node_pools) p), 0) AS cores,
           (c.control_plane->>'count')::bigint * (c.control_plane->>'memory_mib')::bigint
             + coalesce((SELECT sum((p->>'count')::bigint * (p->>'memory_mib')::bigint)
                         FROM jsonb_array_elements(c.node_pools) p), 0) AS memory_mib
    FROM clusters c WHERE c.tenant_id = $1 AND c.status <> 'deleted'
)
SELECT coalesce(sum(cores), 0) AS cores, coalesce(sum(memory_mib), 0) AS memory_mib FROM members;
