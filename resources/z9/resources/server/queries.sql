-- The server type's SQL (its tables), loaded with every other named query by z9.common.sql; called
-- through its store (z9.resources.server.store).

-- name: server_insert
INSERT INTO servers (id, tenant_id, region, name, image, cores, memory_mib, disk_gib, ssh_keys)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
RETURNING *;

-- name: server_insert_with_job
-- server_insert and the job that creates it, in one statement (atomic without an explicit
-- transaction: one round trip). No NOTIFY: the caller notifies after commit.
WITH s AS (
    INSERT INTO servers (id, tenant_id, region, name, image, cores, memory_mib, disk_gib, ssh_keys)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
    RETURNING *
), j AS (
    INSERT INTO jobs ({{job_columns}})
    SELECT $10, $11, s.region, s.tenant_id, 'server', s.id, $12, $13, $14, '{}'::text[], $15, $16 FROM s
    RETURNING id, kind, status
)
SELECT s.*, j.id AS job_id, j.kind AS job_kind, j.status AS job_status FROM s, j;

-- name: server_get
SELECT * FROM servers WHERE id = $1 AND tenant_id = $2;

-- name: server_get_any
SELECT * FROM servers WHERE id = $1;

-- name: server_observed
-- The VM facts verify saw (the status is the lifecycle's: resource_observed).
UPDATE servers
SET vmid = $2, node = $3, power_state = $4, observed_at = now(), updated_at = now()
WHERE id = $1
RETURNING *;

-- name: server_last_failed_job_kind
-- The kind of server $1's latest failed job (its status `failed` came from it), or none.
SELECT kind FROM jobs WHERE resource_id = $1 AND status = 'failed' ORDER BY seq DESC LIMIT 1;

-- name: server_get_for_update
SELECT * FROM servers WHERE id = $1 AND tenant_id = $2 FOR UPDATE;

-- name: server_set_sizes
-- A resize's intent (its ServerResize job, enqueued in the same transaction, makes it true).
UPDATE servers SET cores = $2, memory_mib = $3, disk_gib = $4, updated_at = now()
WHERE id = $1 RETURNING *;

-- name: server_patch
-- Database-only changes (name, labels); NULL: unchanged.
UPDATE servers SET name = coalesce($3, name), labels = coalesce($4::jsonb, labels), updated_at = now()
WHERE id = $1 AND tenant_id = $2 AND status <> 'deleted'
RETURNING *;

-- name: job_failed_primary_assign_of_server
-- The failed job (kind $2: AddressAssign) that is the latest job of server $1's primary address
-- and was to put it on that server: a re-run of the server's failed create re-runs it too.
SELECT j.id
FROM addresses a
CROSS JOIN LATERAL (SELECT id, kind, status, args FROM jobs
                    WHERE resource_id = a.id ORDER BY seq DESC LIMIT 1) j
WHERE a.server_id = $1 AND a.kind = 'primary'
  AND j.kind = $2 AND j.status = 'failed' AND j.args ->> 'server_id' = $1;

-- name: server_quota_usage
-- The tenant's servers' part of its quota use (after tenant_quota_lock, in a new statement): its
-- servers not yet deleted, their cores and memory.
SELECT count(*) AS servers, coalesce(sum(cores), 0) AS cores, coalesce(sum(memory_mib), 0) AS memory_mib
FROM servers WHERE tenant_id = $1 AND status <> 'deleted';
