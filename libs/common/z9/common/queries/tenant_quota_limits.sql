-- The tenant_quota_limits table (migration 0020): a tenant's own quota limits, one row per unit
-- (no row: the Z9_QUOTA_<UNIT> default), and the quota lock. The units are the type registry's
-- (z9.resources.quota_units); each type counts its own use (its slice's <type>_quota_usage).

-- name: tenant_quota_limits_get
-- A tenant's own limits.
SELECT unit, quota FROM tenant_quota_limits WHERE tenant_id = $1;

-- name: tenant_quota_limits_set
-- `z9 quota`: the units $2 set to $3 (one each), the units $4 back to the default (their rows
-- deleted); returns the tenant's own limits after it (the last SELECT reads the rows as they were
-- before this statement: the ones it touched come from its own RETURNING).
WITH reset AS (
    DELETE FROM tenant_quota_limits WHERE tenant_id = $1 AND unit = ANY($4::text[])
), written AS (
    INSERT INTO tenant_quota_limits AS l (tenant_id, unit, quota)
    SELECT $1, v.unit, v.quota FROM unnest($2::text[], $3::bigint[]) AS v (unit, quota)
    ON CONFLICT (tenant_id, unit) DO UPDATE SET quota = EXCLUDED.quota, updated_at = now()
    RETURNING l.unit, l.quota
)
SELECT unit, quota FROM written
UNION ALL
SELECT unit, quota FROM tenant_quota_limits
WHERE tenant_id = $1 AND unit <> ALL($2::text[]) AND unit <> ALL($4::text[]);

-- name: tenant_quota_lock
-- Inside the request's transaction: the tenant's quota lock, held until commit. A statement of
-- its own: a READ COMMITTED statement's snapshot is taken when it starts, so counting in the
-- statement that waited for the lock would miss the rows the holder committed meanwhile. Every
-- count (each type's <type>_quota_usage) is a new statement after it.
SELECT pg_advisory_xact_lock(hashtextextended('z9-quota:' || $1, 0));
