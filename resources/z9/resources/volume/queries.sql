-- The volumes table's named queries (db/z9/db/migrations/0018_volumes.sql); the lifecycle ones
-- (get, list, delete, cancel, reap, observed, failed) are the generic resource_* of libs/common/z9/common/queries/resources.sql.

-- name: volume_insert
INSERT INTO volumes (id, tenant_id, region, name, size_gib, storage, server_id, labels)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
RETURNING *;

-- name: volume_get_for_update
SELECT * FROM volumes WHERE id = $1 AND tenant_id = $2 FOR UPDATE;

-- name: volume_list
-- The generic list's filters ($1 tenant … $11 include_deleted) and the volume's own: $12 region,
-- $13 server.
SELECT * FROM volumes
WHERE tenant_id = $1 AND ($2::text IS NULL OR id > $2) AND ($3::text IS NULL OR status::text = $3)
  AND ($5::text IS NULL OR name = $5)
  AND labels @> $6::jsonb AND NOT (labels @> ANY($7::jsonb[])) AND labels ?& $8::text[]
  AND NOT (labels ?| $9::text[])
  AND NOT EXISTS (SELECT 1 FROM jsonb_array_elements($10::jsonb) r
                  WHERE NOT coalesce((r->'v') ? (labels->>(r->>'k')), false))
  AND ($11::bool OR status::text <> 'deleted')
  AND ($12::text IS NULL OR region = $12) AND ($13::text IS NULL OR server_id = $13)
ORDER BY id
LIMIT $4;

-- name: volume_set_server
-- The server the volume is meant to be on ($2; NULL: none); a live volume only.
UPDATE volumes SET server_id = $2, updated_at = now()
WHERE id = $1 AND status NOT IN ('deleting', 'destroying', 'deleted')
RETURNING *;

-- name: volume_set_size
UPDATE volumes SET size_gib = $2, updated_at = now()
WHERE id = $1 AND status NOT IN ('deleting', 'destroying', 'deleted')
RETURNING *;

-- name: volume_patch
-- $3 a new name (NULL: kept), $4 labels (NULL: kept).
UPDATE volumes SET name = coalesce($3, name), labels = coalesce($4::jsonb, labels), updated_at = now()
WHERE id = $1 AND tenant_id = $2 AND status <> 'deleted'
RETURNING *;

-- name: volume_observed
-- What verify saw; the status it established ($3) only from one of $4 (never over a deletion). The disk
-- is where verify saw it: its recorded volids are that one alone.
UPDATE volumes
SET observed = $2, observed_at = now(), updated_at = now(),
    disk_volids = CASE WHEN $2::jsonb->>'volid' IS NULL THEN disk_volids ELSE ARRAY[$2::jsonb->>'volid'] END,
    status = {{status_if_allowed($3, $4, volume_status)}},
    status_reason = {{reason_cleared_if_allowed($3, $4)}}
WHERE id = $1
RETURNING *;

-- name: volume_of_server
-- The live volumes meant to be on server $1 (a server's delete detaches them or deletes them).
SELECT * FROM volumes WHERE server_id = $1 AND status NOT IN ('deleting', 'destroying', 'deleted')
ORDER BY id FOR UPDATE;

-- name: volume_add_disk_volid
-- A step is about to move or unplug the volume's disk ($2: the volid it acts on), or an attach moved it
-- ($2: the volid it got on the server): one more place the disk may be until a verify sees it.
UPDATE volumes SET disk_volids = array_append(disk_volids, $2)
WHERE id = $1 AND status <> 'deleted' AND NOT ($2 = ANY (disk_volids));

-- name: volume_disks_of_region
-- The deletion guard's record of region $1: every volume not deleted, with the volids its disk may have.
SELECT id, disk_volids FROM volumes WHERE region = $1 AND status <> 'deleted' AND disk_volids <> '{}';

-- name: volume_last_seen_on_server
-- The live volumes meant for no server whose disk a verify last saw on server $1 (a detach of theirs failed
-- part-way, the disk left there): a server's deletion takes them off it too.
SELECT * FROM volumes
WHERE server_id IS NULL AND observed->>'server_id' = $1 AND status NOT IN ('deleting', 'destroying', 'deleted')
ORDER BY id FOR UPDATE;

-- name: volume_count_of_server
-- How many live volumes are meant for server $1, other than volume $2 (an attach or a create counts
-- against the per-server limit; read under the server's row lock, which every attach takes first).
SELECT count(*) FROM volumes
WHERE server_id = $1 AND id <> $2 AND status NOT IN ('deleting', 'destroying', 'deleted');

-- name: volume_detached_by_deletion_of
-- The live volumes of tenant $2 that server $1's deletion detached and nothing has changed since: meant
-- for no server, and their newest job the detach ($3, VolumeDetach) that deletion made (args.from).
SELECT v.* FROM volumes v
WHERE v.tenant_id = $2 AND v.server_id IS NULL AND v.status NOT IN ('deleting', 'destroying', 'deleted')
  AND (SELECT j.kind = $3 AND j.args->>'from' = $1 FROM jobs j
       WHERE j.resource_type = 'volume' AND j.resource_id = v.id ORDER BY j.seq DESC LIMIT 1)
ORDER BY v.id FOR UPDATE OF v;

-- name: volume_quota_usage
-- The tenant's volumes' part of its quota use (after tenant_quota_lock, in a new statement): the
-- sizes of its volumes not yet deleted.
SELECT coalesce(sum(size_gib), 0) AS volume_gib FROM volumes WHERE tenant_id = $1 AND status <> 'deleted';
