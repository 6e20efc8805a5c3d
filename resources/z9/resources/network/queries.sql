-- The networks tables' named queries (db/z9/db/migrations/0026_networks.sql); the lifecycle ones
-- (get, list, delete, cancel, reap, observed, failed) are the generic resource_* of libs/common/z9/common/queries/resources.sql.

-- name: network_insert
-- $6: the region's tag range (first, last): the lowest tag free among the region's networks not yet
-- deleted (network_vni_live decides a race: the loser's statement fails and the API tries again).
INSERT INTO networks (id, tenant_id, region, name, ip_range, vni, vnet, labels)
SELECT $1, $2, $3, $4, $5::cidr, t.vni, 'z9' || to_hex(t.vni), $7
FROM (SELECT g AS vni FROM generate_series(($6::int[])[1], ($6::int[])[2]) g
      WHERE NOT EXISTS (SELECT 1 FROM networks n WHERE n.region = $3 AND n.vni = g AND n.status <> 'deleted')
      ORDER BY g LIMIT 1) t
RETURNING *;

-- name: network_get_for_update
SELECT * FROM networks WHERE id = $1 AND tenant_id = $2 FOR UPDATE;

-- name: network_list
-- The generic list's filters ($1 tenant … $11 include_deleted) and the network's own: $12 region.
SELECT * FROM networks
WHERE tenant_id = $1 AND ($2::text IS NULL OR id > $2) AND ($3::text IS NULL OR status::text = $3)
  AND ($5::text IS NULL OR name = $5)
  AND labels @> $6::jsonb AND NOT (labels @> ANY($7::jsonb[])) AND labels ?& $8::text[]
  AND NOT (labels ?| $9::text[])
  AND NOT EXISTS (SELECT 1 FROM jsonb_array_elements($10::jsonb) r
                  WHERE NOT coalesce((r->'v') ? (labels->>(r->>'k')), false))
  AND ($11::bool OR status::text <> 'deleted')
  AND ($12::text IS NULL OR region = $12)
ORDER BY id
LIMIT $4;

-- name: network_patch
UPDATE networks SET name = coalesce($3, name), labels = coalesce($4::jsonb, labels), updated_at = now()
WHERE id = $1 AND tenant_id = $2 AND status <> 'deleted'
RETURNING *;

-- name: network_observed
-- What verify saw; the status it established ($3) only from one of $4 (never over a deletion).
UPDATE networks
SET observed = $2, observed_at = now(), updated_at = now(),
    status = {{status_if_allowed($3, $4, network_status)}},
    status_reason = {{reason_cleared_if_allowed($3, $4)}}
WHERE id = $1
RETURNING *;

-- name: network_vnets_of_region
-- Every network of region $1 that has (or had) a VNet: what the region's SDN apply converges (the
-- VNet of a network not yet destroying is wanted; of one destroying or deleted, not).
SELECT id, name, vnet, vni, status::text AS status FROM networks WHERE region = $1 ORDER BY vni;

-- name: network_member_insert
-- A server joins a network: its address there ($4, or NULL: the lowest free of the range between
-- $5 and $6 — the range's first and last host addresses) and its NIC (the lowest netN the server has
-- free: net1 … net31). NULL when no address is free (no_subnet_available); a taken address fails on
-- network_members_ip (ip_not_available).
INSERT INTO network_members (network_id, server_id, tenant_id, ip, nic)
SELECT $1, $2, $3, a.ip, n.nic
FROM (SELECT coalesce($4::inet, (SELECT $5::inet + g FROM generate_series(0, $6::inet - $5::inet) g
                                 WHERE NOT EXISTS (SELECT 1 FROM network_members m
                                                   WHERE m.network_id = $1 AND m.ip = $5::inet + g)
                                 ORDER BY g LIMIT 1)) AS ip) a,
     (SELECT 'net' || g AS nic FROM generate_series(1, 31) g
      WHERE NOT EXISTS (SELECT 1 FROM network_members m WHERE m.server_id = $2 AND m.nic = 'net' || g)
      ORDER BY g LIMIT 1) n
WHERE a.ip IS NOT NULL
RETURNING *;

-- name: network_member_get
SELECT * FROM network_members WHERE network_id = $1 AND server_id = $2;

-- name: network_members_of
-- The members of network $1 (the 409 resource_in_use lists them).
SELECT * FROM network_members WHERE network_id = $1 ORDER BY server_id;

-- name: network_members_of_server
SELECT * FROM network_members WHERE server_id = $1 ORDER BY nic;

-- name: network_member_set_state
UPDATE network_members SET state = $3, updated_at = now() WHERE network_id = $1 AND server_id = $2 RETURNING *;

-- name: network_member_delete
DELETE FROM network_members WHERE network_id = $1 AND server_id = $2 RETURNING *;

-- name: network_members_of_server_delete
-- A server deleted for good: its NICs went with its VM.
DELETE FROM network_members WHERE server_id = $1 RETURNING *;

-- name: sdn_region_lock
-- The region's SDN row, made when missing, locked until the transaction ends (every network edit
-- and the apply job's start take it in this order).
INSERT INTO sdn_regions (region) VALUES ($1) ON CONFLICT (region) DO UPDATE SET region = excluded.region
RETURNING *;

-- name: sdn_region_get
SELECT * FROM sdn_regions WHERE region = $1;

-- name: sdn_region_set_apply_job
UPDATE sdn_regions SET apply_job_id = $2, updated_at = now() WHERE region = $1 RETURNING *;

-- name: sdn_region_take_apply
-- The apply job starts ($2): the next edit enqueues the next apply (under the row's lock).
UPDATE sdn_regions SET apply_job_id = NULL, updated_at = now()
WHERE region = $1 AND apply_job_id IS NOT DISTINCT FROM $2
RETURNING *;

-- name: sdn_region_record_lock
-- The lock token z9 was given ($2, by job $3), or none ($2 NULL: released).
UPDATE sdn_regions
SET lock_token = $2, lock_job_id = CASE WHEN $2::text IS NULL THEN NULL ELSE $3 END,
    lock_taken_at = CASE WHEN $2::text IS NULL THEN NULL ELSE now() END, updated_at = now()
WHERE region = $1
RETURNING *;

-- name: sdn_region_set_condition
UPDATE sdn_regions SET condition = $2, updated_at = now() WHERE region = $1 RETURNING *;

-- name: sdn_region_applied
UPDATE sdn_regions SET applies = applies + 1, applied_at = now(), condition = NULL, updated_at = now()
WHERE region = $1 RETURNING *;

-- name: sdn_region_conditions
-- Every region's SDN condition (the operator's view and the metric).
SELECT region, condition, lock_token IS NOT NULL AS locked, applies, applied_at FROM sdn_regions ORDER BY region;

-- name: sdn_apply_last_finished
-- The region's ($1: its apply resource, sdn:<region>) newest finished SDN apply job: a permanent
-- failure (the token lacks SDN.Allocate) ends the network jobs waiting on it.
SELECT id, status::text AS status, error, finished_at FROM jobs
WHERE resource_id = $1 AND status IN ('succeeded', 'failed')
ORDER BY seq DESC LIMIT 1;
