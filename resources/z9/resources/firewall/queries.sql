-- The firewalls tables' named queries (db/z9/db/migrations/0027_firewalls.sql); the lifecycle ones (get,
-- list, delete, observed, failed) are the generic resource_* of libs/common/z9/common/queries/resources.sql.

-- name: firewall_insert
INSERT INTO firewalls (id, tenant_id, region, name, rules, applied_to, labels)
VALUES ($1, $2, $3, $4, $5, $6, $7)
RETURNING *;

-- name: firewall_get_for_update
SELECT * FROM firewalls WHERE id = $1 AND tenant_id = $2 FOR UPDATE;

-- name: firewall_get_for_share
-- Firewall $1 of tenant $2 that a rule being written names ("members of"), share-locked until the request's
-- transaction ends: its deletion (an UPDATE, which waits for this lock) then sees the rule naming it.
SELECT * FROM firewalls WHERE id = $1 AND tenant_id = $2 FOR SHARE;

-- name: firewall_set
-- A change of rules ($2, NULL: kept) or of applied_to ($3, NULL: kept): a new generation (every member
-- pending again: its rules are to be written and seen enforced).
UPDATE firewalls
SET rules = coalesce($2::jsonb, rules), applied_to = coalesce($3::jsonb, applied_to), generation = generation + 1,
    updated_at = now()
WHERE id = $1 AND status NOT IN ('deleting', 'destroying', 'deleted')
RETURNING *;

-- name: firewall_bump
-- A new generation without a change of the row (a member added by a new server's labels).
UPDATE firewalls SET generation = generation + 1, updated_at = now() WHERE id = $1 RETURNING *;

-- name: firewall_patch
UPDATE firewalls SET name = coalesce($3, name), labels = coalesce($4::jsonb, labels), updated_at = now()
WHERE id = $1 AND tenant_id = $2 AND status <> 'deleted'
RETURNING *;

-- name: firewall_members_of
-- The member rows of firewalls $1 (an array), by firewall then server.
SELECT * FROM firewall_members WHERE firewall_id = ANY($1::text[]) ORDER BY firewall_id, server_id;

-- name: firewall_member_upsert
-- Server $2 is a member of firewall $1 by $3 (server | label_selector), pending (again).
INSERT INTO firewall_members (firewall_id, server_id, via, state)
VALUES ($1, $2, $3, 'pending')
ON CONFLICT (firewall_id, server_id)
DO UPDATE SET via = EXCLUDED.via, state = 'pending', applied_at = NULL, detail = NULL, updated_at = now();

-- name: firewall_member_removing
-- Server $2 leaves firewall $1: its rules are to be taken off the server's VM (the row goes when done).
UPDATE firewall_members SET state = 'removing', applied_at = NULL, updated_at = now()
WHERE firewall_id = $1 AND server_id = $2;

-- name: firewall_members_pending
-- Every live member of firewall $1 pending again (its rules changed).
UPDATE firewall_members SET state = 'pending', applied_at = NULL, updated_at = now()
WHERE firewall_id = $1 AND state <> 'removing';

-- name: firewall_member_applied
-- What a job saw on server $2's VM for firewall $1 at generation $3: applied ($4 true: its rules there, one
-- pve-firewall cycle after they were written, and the check answered as they say) or still pending with
-- $6, the reason; $5 enforced. Only a member still pending at that generation moves (a later request
-- made it pending again: its own job will say).
UPDATE firewall_members m
SET state = CASE WHEN $4 THEN 'applied'::firewall_member_state ELSE m.state END,
    applied_at = CASE WHEN $4 THEN coalesce($7::timestamptz, now()) ELSE NULL END,
    generation = CASE WHEN $4 THEN $3 ELSE m.generation END,
    enforced = $5, detail = $6, updated_at = now()
FROM firewalls f
WHERE m.firewall_id = $1 AND m.server_id = $2 AND f.id = m.firewall_id AND f.generation = $3
  AND m.state = 'pending';

-- name: firewall_member_removed
-- Server $2's VM no longer carries firewall $1's rules: the row goes (only if still leaving).
DELETE FROM firewall_members WHERE firewall_id = $1 AND server_id = $2 AND state = 'removing';

-- name: firewall_member_forget_server
-- Server $1 is deleted for good: a member of no firewall.
DELETE FROM firewall_members WHERE server_id = $1;

-- name: firewall_member_forget
-- Server $2 is deleted for good: no member of firewall $1 (whatever its state).
DELETE FROM firewall_members WHERE firewall_id = $1 AND server_id = $2;

-- name: firewall_members_live_servers
-- The members of firewall $1 that its "members of" set holds: not leaving, their server not being deleted.
SELECT m.server_id FROM firewall_members m JOIN servers s ON s.id = m.server_id
WHERE m.firewall_id = $1 AND m.state <> 'removing' AND s.status NOT IN ('deleting', 'destroying', 'deleted')
ORDER BY m.server_id;

-- name: firewall_holding_server
-- The live firewalls server $1 is a member of (any state) or that name it in applied_to, by id, locked
-- (server first, then its firewalls: the order of a relabel and of apply-to-resources).
SELECT f.* FROM firewalls f
WHERE f.status NOT IN ('deleting', 'destroying', 'deleted')
  AND (EXISTS (SELECT 1 FROM firewall_members m WHERE m.firewall_id = f.id AND m.server_id = $1)
       OR f.applied_to @> jsonb_build_array(jsonb_build_object('server_id', $1::text)))
ORDER BY f.id FOR UPDATE OF f;

-- name: firewall_of_server
-- The live firewalls applied to server $1 (its VM's part), by id.
SELECT f.* FROM firewalls f JOIN firewall_members m ON m.firewall_id = f.id
WHERE m.server_id = $1 AND m.state <> 'removing' AND f.status NOT IN ('deleting', 'destroying', 'deleted')
ORDER BY f.id;

-- name: firewall_count_of_server
-- How many firewalls apply to server $1 (the most a server takes: 5), other than firewall $2.
SELECT count(*) FROM firewall_members m JOIN firewalls f ON f.id = m.firewall_id
WHERE m.server_id = $1 AND m.firewall_id <> $2 AND m.state <> 'removing'
  AND f.status NOT IN ('deleting', 'destroying', 'deleted');

-- name: firewall_selecting
-- The live firewalls of tenant $1 in region $2 with a label selector in applied_to (their selectors are
-- matched against a server's labels by the caller), locked.
SELECT * FROM firewalls
WHERE tenant_id = $1 AND region = $2 AND status NOT IN ('deleting', 'destroying', 'deleted')
  AND EXISTS (SELECT 1 FROM jsonb_array_elements(applied_to) a WHERE a ? 'label_selector')
ORDER BY id FOR UPDATE;

-- name: firewall_servers_matching
-- The live servers of tenant $1 in region $2 matching a label selector ($3-$7, z9.common.labels), locked.
SELECT id FROM servers
WHERE tenant_id = $1 AND region = $2 AND status NOT IN ('deleting', 'destroying', 'deleted')
  AND labels @> $3::jsonb AND NOT (labels @> ANY($4::jsonb[])) AND labels ?& $5::text[]
  AND NOT (labels ?| $6::text[])
  AND NOT EXISTS (SELECT 1 FROM jsonb_array_elements($7::jsonb) r
                  WHERE NOT coalesce((r->'v') ? (labels->>(r->>'k')), false))
ORDER BY id FOR UPDATE;

-- name: firewall_list
-- The generic list's filters ($1 tenant … $11 include_deleted) and the firewall's own: $12 region.
SELECT * FROM firewalls
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

-- name: firewall_observed
-- What the last job saw (the IP set, the members' counts); status from $3 only out of $4.
UPDATE firewalls
SET observed = $2, observed_at = now(), updated_at = now(),
    status = {{status_if_allowed($3, $4, firewall_status)}},
    status_reason = {{reason_cleared_if_allowed($3, $4)}}
WHERE id = $1
RETURNING *;

-- name: firewall_referenced_by
-- The live firewalls whose rules name the members of firewall $1 (source_firewalls/destination_firewalls).
SELECT id FROM firewalls
WHERE status NOT IN ('deleting', 'destroying', 'deleted')
  AND (rules @> jsonb_build_array(jsonb_build_object('source_firewalls', jsonb_build_array($1::text)))
       OR rules @> jsonb_build_array(jsonb_build_object('destination_firewalls', jsonb_build_array($1::text))))
ORDER BY id;
