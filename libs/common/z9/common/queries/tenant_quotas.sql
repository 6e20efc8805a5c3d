-- The tenant_quotas table: per-tenant quota overrides, the quota lock and the use.

-- name: tenant_quota_get
-- A tenant's quota overrides (no row: none).
SELECT servers, cores, memory_mib, addresses, load_balancers, volume_gib FROM tenant_quotas WHERE tenant_id = $1;

-- name: tenant_quota_set
-- `z9 quota`: $3..$8 with $2 telling which are given (a NULL given resets it to the default).
INSERT INTO tenant_quotas AS t (tenant_id, servers, cores, memory_mib, addresses, load_balancers, volume_gib)
VALUES ($1, CASE WHEN 'servers' = ANY($2::text[]) THEN $3::integer END, CASE WHEN 'cores' = ANY($2::text[]) THEN $4::integer END,
        CASE WHEN 'memory_mib' = ANY($2::text[]) THEN $5::bigint END, CASE WHEN 'addresses' = ANY($2::text[]) THEN $6::integer END,
        CASE WHEN 'load_balancers' = ANY($2::text[]) THEN $7::integer END, CASE WHEN 'volume_gib' = ANY($2::text[]) THEN $8::bigint END)
ON CONFLICT (tenant_id) DO UPDATE
SET servers = CASE WHEN 'servers' = ANY($2::text[]) THEN $3::integer ELSE t.servers END,
    cores = CASE WHEN 'cores' = ANY($2::text[]) THEN $4::integer ELSE t.cores END,
    memory_mib = CASE WHEN 'memory_mib' = ANY($2::text[]) THEN $5::bigint ELSE t.memory_mib END,
    addresses = CASE WHEN 'addresses' = ANY($2::text[]) THEN $6::integer ELSE t.addresses END,
    load_balancers = CASE WHEN 'load_balancers' = ANY($2::text[]) THEN $7::integer ELSE t.load_balancers END,
    volume_gib = CASE WHEN 'volume_gib' = ANY($2::text[]) THEN $8::bigint ELSE t.volume_gib END,
    updated_at = now()
RETURNING servers, cores, memory_mib, addresses, load_balancers, volume_gib;

-- name: tenant_quota_lock
-- Inside the request's transaction: the tenant's quota lock, held until commit. A statement of
-- its own: a READ COMMITTED statement's snapshot is taken when it starts, so counting in the
-- statement that waited for the lock would miss the rows the holder committed meanwhile.
SELECT pg_advisory_xact_lock(hashtextextended('z9-quota:' || $1, 0));

-- name: tenant_quota_usage
-- The tenant's use (after tenant_quota_lock, in a new statement). Rows not yet deleted count.
-- Cores and memory: its servers' plus the members of its clusters (their desired shape: every
-- control plane and every pool member is a VM of the tenant's); a cluster is no server (the
-- servers count leaves members out); its endpoint is an address (in the addresses count).
WITH members AS (
    SELECT (c.control_plane->>'count')::bigint * (c.control_plane->>'cores')::bigint
             + coalesce((SELECT sum((p->>'count')::bigint * (p->>'cores')::bigint)
                         FROM jsonb_array_elements(c.node_pools) p), 0) AS cores,
           (c.control_plane->>'count')::bigint * (c.control_plane->>'memory_mib')::bigint
             + coalesce((SELECT sum((p->>'count')::bigint * (p->>'memory_mib')::bigint)
                         FROM jsonb_array_elements(c.node_pools) p), 0) AS memory_mib
    FROM clusters c WHERE c.tenant_id = $1 AND c.status <> 'deleted'
)
SELECT (SELECT count(*) FROM servers WHERE tenant_id = $1 AND status <> 'deleted') AS servers,
       (SELECT coalesce(sum(cores), 0) FROM servers WHERE tenant_id = $1 AND status <> 'deleted')
         + (SELECT coalesce(sum(cores), 0) FROM members) AS cores,
       (SELECT coalesce(sum(memory_mib), 0) FROM servers WHERE tenant_id = $1 AND status <> 'deleted')
         + (SELECT coalesce(sum(memory_mib), 0) FROM members) AS memory_mib,
       (SELECT count(*) FROM addresses WHERE tenant_id = $1 AND status <> 'deleted') AS addresses,
       (SELECT count(*) FROM load_balancers WHERE tenant_id = $1 AND status <> 'deleted') AS load_balancers,
       (SELECT coalesce(sum(size_gib), 0) FROM volumes WHERE tenant_id = $1 AND status <> 'deleted') AS volume_gib;
