-- The address type's SQL (its tables), loaded with every other named query by z9.common.sql; called
-- through its store (z9.resources.address.store).

-- ---------------------------------------------------------------- address pools (migration 0005)

-- name: address_pools_sync_wait
-- Before address_pools_sync_lock: an API process starting while another syncs (large pools take
-- seconds) waits for it, bounded by statement_timeout rather than the role's short lock_timeout
-- (which gave up and ended the process's startup). For the sync's transaction only.
SET LOCAL lock_timeout = 0;

-- name: address_pools_sync_lock
SELECT pg_advisory_xact_lock(hashtextextended('z9-address-pools-sync', 0));

-- name: address_pools_retire_region
-- Before a region's pools are written again: every pool of the region is set aside (a pool left
-- out of the settings stays so, and stops counting in the overlap rule); address_pool_upsert
-- brings back the configured ones, so pools that swap ranges never overlap in between.
UPDATE address_pools SET disabled_at = coalesce(disabled_at, now()), updated_at = now()
WHERE region = $1;

-- name: address_pool_upsert
INSERT INTO address_pools (id, region, name, family, cidr, gateway, first_ip, last_ip, reserved,
                           bridge, vlan, nameservers, quarantine_s)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)
ON CONFLICT (region, name) DO UPDATE
SET family = EXCLUDED.family, cidr = EXCLUDED.cidr, gateway = EXCLUDED.gateway,
    first_ip = EXCLUDED.first_ip, last_ip = EXCLUDED.last_ip, reserved = EXCLUDED.reserved,
    bridge = EXCLUDED.bridge, vlan = EXCLUDED.vlan, nameservers = EXCLUDED.nameservers,
    quarantine_s = EXCLUDED.quarantine_s, disabled_at = NULL, updated_at = now()
RETURNING id;

-- name: address_pool_overlapping
-- The enabled pools of region $1 other than $3 whose network overlaps $2 (for the message
-- when address_pools_no_overlap refuses a pool).
SELECT name, cidr FROM address_pools
WHERE region = $1 AND disabled_at IS NULL AND cidr && $2::cidr AND name <> $3
ORDER BY name;

-- name: address_pool_ips_prune
-- Free rows the pool no longer hands out (out of its range, reserved, its gateway). Rows held
-- by a live address stay until it is released.
DELETE FROM address_pool_ips i
USING address_pools p
WHERE p.id = $1 AND i.pool_id = p.id AND i.address_id IS NULL
  AND (i.ip < p.first_ip OR i.ip > p.last_ip OR i.ip = ANY (p.reserved)
       OR i.ip = p.gateway OR NOT i.ip << p.cidr);

-- name: address_pool_ips_fill
-- One row per allocatable IP of the pool (the range minus reserved IPs and the gateway).
INSERT INTO address_pool_ips (pool_id, ip)
SELECT p.id, p.first_ip + n
FROM address_pools p, generate_series(0::bigint, p.last_ip - p.first_ip) AS n
WHERE p.id = $1 AND NOT (p.first_ip + n = ANY (p.reserved)) AND (p.first_ip + n) IS DISTINCT FROM p.gateway
ON CONFLICT (pool_id, ip) DO NOTHING;

-- name: address_pool_list
SELECT p.*,
       (SELECT count(*) FROM address_pool_ips i WHERE i.pool_id = p.id) AS size,
       (SELECT count(*) FROM address_pool_ips i WHERE i.pool_id = p.id AND i.address_id IS NOT NULL) AS used
FROM address_pools p
WHERE ($1::text IS NULL OR p.region = $1) AND p.disabled_at IS NULL
ORDER BY p.region, p.name;

-- name: address_pool_pick
-- The enabled pool of region $1 and family $2 that an allocation draws from: the one named $3,
-- or without a name the one named 'public', or else the region's only pool of that family.
-- Returns every candidate (the caller tells "none" from "which one?").
SELECT * FROM address_pools
WHERE region = $1 AND family = $2 AND disabled_at IS NULL AND ($3::text IS NULL OR name = $3)
ORDER BY (name = 'public') DESC, name;

-- ---------------------------------------------------------------- addresses (migration 0005)

-- name: address_allocate
-- Allocate the lowest free IP of pool $2 to a new address, in the caller's transaction (the one
-- that inserts the job using it, or the server it belongs to). Concurrent allocators skip each
-- other's locked rows instead of waiting; a quarantined row is skipped until reusable_after.
-- No row: the pool is exhausted (or every free row is held by an allocation in flight).
-- Only a row the pool still hands out (settings may have reserved its IP or moved it out of the
-- range while an address held it) and whose IP no live address of the region holds (a pool
-- renamed or replaced in the settings has rows for IPs the disabled one's addresses still hold).
WITH slot AS (
    {{free_ip_slot($2)}}
), adr AS (
    INSERT INTO addresses (id, tenant_id, region, pool_id, pool_name, prefix, gateway, ip, family, kind,
                           name, dns_ptr, protect_delete, auto_delete, server_id)
    SELECT $1, $3, p.region, p.id, p.name, masklen(p.cidr), p.gateway, slot.ip, p.family, $4,
           $5, $6, $7, $8, $9
    FROM slot JOIN address_pools p ON p.id = slot.pool_id
    RETURNING *
), held AS (
    {{hold_slot($1)}}
)
SELECT adr.* FROM adr, held;

-- name: address_release
-- The address's IP goes back to its pool, quarantined for the pool's quarantine_s (migration
-- 0005). Called in the transaction that marks the address deleted.
UPDATE address_pool_ips i
SET address_id = NULL, reusable_after = now() + make_interval(secs => p.quarantine_s)
FROM address_pools p
WHERE i.address_id = $1 AND p.id = i.pool_id
RETURNING i.ip, i.reusable_after;

-- name: address_get
SELECT * FROM addresses WHERE id = $1 AND ($2::text IS NULL OR tenant_id = $2);

-- name: address_list
SELECT * FROM addresses
WHERE tenant_id = $1 AND ($2::text IS NULL OR id > $2) AND ($3::address_status IS NULL OR status = $3)
  AND ($4::text IS NULL OR region = $4) AND ($11::text IS NULL OR server_id = $11)
  AND ($5::text IS NULL OR name = $5)
  -- the label selector (z9.common.labels): $6 k=v, $7 k!=v, $8 k, $9 !k, $10 k in (…)
  AND labels @> $6::jsonb AND NOT (labels @> ANY($7::jsonb[])) AND labels ?& $8::text[]
  AND NOT (labels ?| $9::text[])
  AND NOT EXISTS (SELECT 1 FROM jsonb_array_elements($10::jsonb) r
                  WHERE NOT coalesce((r->'v') ? (labels->>(r->>'k')), false))
  AND ($13::bool OR status <> 'deleted')  -- false: not the deleted ones (as resource_list's $11)
ORDER BY id
LIMIT $12;

-- name: address_observed
-- What verify saw ($2), and the status it established ($3) when the current one is in $4
-- (never over the deletion states); the reason becomes $5 (a conflict, or NULL).
UPDATE addresses
SET observed = $2, observed_at = now(), updated_at = now(),
    status = {{status_if_allowed($3, $4, address_status)}},
    status_reason = CASE WHEN status IN ('deleting', 'destroying') AND $5::text IS NULL
                         THEN status_reason ELSE $5 END
WHERE id = $1 AND status <> 'deleted'
RETURNING *;

-- name: address_deleted
-- The final delete's finish: destroying → deleted, the IP back to its pool, quarantined.
WITH a AS (
    UPDATE addresses
    SET status = 'deleted', deleted_at = now(), server_id = NULL, observed = $2, observed_at = now(),
        status_reason = NULL, updated_at = now()
    WHERE id = $1 AND status = 'destroying'
    RETURNING id
)
UPDATE address_pool_ips i
SET address_id = NULL, reusable_after = now() + make_interval(secs => p.quarantine_s)
FROM address_pools p, a
WHERE i.address_id = a.id AND p.id = i.pool_id
RETURNING i.ip;

-- name: address_pool_nameservers
SELECT coalesce(array_agg(host(n) ORDER BY o), '{}')
FROM address_pools p, unnest(p.nameservers) WITH ORDINALITY AS u(n, o)
WHERE p.id = $1;

-- name: addresses_release_for_server
-- A server's final delete, after verify saw its VM gone, in its finishing transaction: its
-- floating addresses and kept primaries become unassigned (the VM, its tags and IP set went
-- with it); its auto-delete primaries are deleted and their IPs go back to the pool,
-- quarantined — unless protected against deletion: protection wins, the address is kept
-- (unassigned). Nothing unless the server is deleted. Returns the addresses changed.
WITH gone AS (
    UPDATE addresses
    SET status = 'deleted', deleted_at = now(), server_id = NULL, observed = NULL, observed_at = now(),
        status_reason = NULL, updated_at = now()
    WHERE server_id = $1 AND kind = 'primary' AND auto_delete AND NOT protect_delete AND status <> 'deleted'
      AND EXISTS (SELECT 1 FROM servers s WHERE s.id = $1 AND s.status = 'deleted')
    RETURNING id
), freed AS (
    UPDATE address_pool_ips i
    SET address_id = NULL, reusable_after = now() + make_interval(secs => p.quarantine_s)
    FROM address_pools p, gone
    WHERE i.address_id = gone.id AND p.id = i.pool_id
    RETURNING i.address_id
), kept AS (
    UPDATE addresses
    -- (never observed: stays NULL — a bare {"holder": null} is no observation, and GET refused it)
    SET server_id = NULL, observed = jsonb_set(observed, '{holder}', 'null'),
        observed_at = now(), updated_at = now()
    WHERE server_id = $1 AND NOT (kind = 'primary' AND auto_delete AND NOT protect_delete) AND status <> 'deleted'
      AND EXISTS (SELECT 1 FROM servers s WHERE s.id = $1 AND s.status = 'deleted')
    RETURNING id
)
SELECT id, 'deleted' AS outcome FROM gone UNION ALL SELECT id, 'unassigned' FROM kept;

-- name: address_allocate_with_job
-- address_allocate and the job that uses it, in one statement (atomic without an explicit
-- transaction: one round trip). The pool: region $2, family $16, named $17 — or, unnamed, the
-- one named 'public', else the region's only pool of that family. No row: no such pool, or it
-- is exhausted (nothing written; the caller tells which). No NOTIFY: the caller notifies after
-- commit. $18, $19: the job's actor token and request id (migration 0007).
WITH cand AS (
    SELECT id, name FROM address_pools
    WHERE region = $2 AND family = $16 AND disabled_at IS NULL AND ($17::text IS NULL OR name = $17)
), pool AS (
    SELECT id FROM cand
    WHERE $17::text IS NOT NULL OR name = 'public' OR (SELECT count(*) FROM cand) = 1
    ORDER BY (name = 'public') DESC
    LIMIT 1
), slot AS (
    {{free_ip_slot((SELECT id FROM pool))}}
), adr AS (
    INSERT INTO addresses (id, tenant_id, region, pool_id, pool_name, prefix, gateway, ip, family, kind,
                           name, dns_ptr, protect_delete, auto_delete, server_id)
    SELECT $1, $3, p.region, p.id, p.name, masklen(p.cidr), p.gateway, slot.ip, p.family, $4,
           $5, $6, $7, $8, $9
    FROM slot JOIN address_pools p ON p.id = slot.pool_id
    RETURNING *
), held AS (
    {{hold_slot($1)}}
), j AS (
    INSERT INTO jobs ({{job_columns}})
    SELECT $10, $11, adr.region, adr.tenant_id, 'address', adr.id, $12, $13, $14, $15, $18, $19 FROM adr
    RETURNING id, kind, status
)
SELECT adr.*, j.id AS job_id, j.kind AS job_kind, j.status AS job_status FROM adr, held, j;

-- name: address_pool_in_flight
-- After an allocation found no row: does the pool ($1; NULL: the one address_allocate_with_job
-- picks for region $2, family $3, name $4) still have rows an allocation could take? They were
-- skipped because allocations in flight hold them (SKIP LOCKED), and may be free again when
-- those roll back (a name taken, a load balancer short of its second address): the pool is not
-- exhausted yet. Rows this transaction took itself count as taken.
WITH cand AS (
    SELECT id, name FROM address_pools
    WHERE region = $2 AND family = $3 AND disabled_at IS NULL AND ($4::text IS NULL OR name = $4)
), pool AS (
    SELECT id FROM cand
    WHERE $4::text IS NOT NULL OR name = 'public' OR (SELECT count(*) FROM cand) = 1
    ORDER BY (name = 'public') DESC
    LIMIT 1
)
SELECT EXISTS (
    SELECT 1 FROM address_pool_ips i JOIN address_pools p ON p.id = i.pool_id
    WHERE i.pool_id = coalesce($1::text, (SELECT id FROM pool)) AND i.address_id IS NULL
      AND (i.reusable_after IS NULL OR i.reusable_after <= now())
      AND i.ip BETWEEN p.first_ip AND p.last_ip AND NOT (i.ip = ANY (p.reserved))
      AND i.ip IS DISTINCT FROM p.gateway
      AND NOT EXISTS (SELECT 1 FROM addresses a WHERE a.region = p.region AND a.ip = i.ip AND a.status <> 'deleted'));

-- name: address_get_for_update
SELECT * FROM addresses WHERE id = $1 AND tenant_id = $2 FOR UPDATE;

-- name: address_owner
-- The resource an address belongs to, if any: a load balancer (its VIP or an appliance's
-- address) or a live Kubernetes cluster (its control-plane endpoint). Such an address is never
-- assigned to a server, nor made one's primary: its owner's VMs hold it.
SELECT a.load_balancer_id,
       (SELECT c.id FROM clusters c WHERE c.endpoint_address_id = a.id AND c.status <> 'deleted'
        ORDER BY c.id LIMIT 1) AS cluster_id
FROM addresses a WHERE a.id = $1;

-- name: address_set_server
-- The server the address should be on ($2; NULL: none): the API's intent, which the job it
-- enqueues in the same transaction makes true.
UPDATE addresses SET server_id = $2, updated_at = now()
WHERE id = $1 AND status NOT IN ('deleting', 'destroying', 'deleted')
RETURNING *;

-- name: address_patch
-- Database-only changes: $3/$5 say whether name/dns_ptr are given (they may be set to NULL).
UPDATE addresses
SET name = CASE WHEN $3 THEN $4 ELSE name END,
    dns_ptr = CASE WHEN $5 THEN $6 ELSE dns_ptr END,
    protect_delete = coalesce($7, protect_delete),
    auto_delete = coalesce($8, auto_delete),
    labels = coalesce($9::jsonb, labels),
    updated_at = now()
WHERE id = $1 AND tenant_id = $2 AND status <> 'deleted'
RETURNING *;

-- name: address_make_primary
-- An unassigned address becomes server $2's primary (POST /v1/servers with public_ipv4: <id>).
UPDATE addresses SET kind = 'primary', server_id = $2, updated_at = now()
WHERE id = $1 AND server_id IS NULL AND status IN ('creating', 'active')
RETURNING *;

-- name: address_ip_held_by_other_tenant
-- Whether a live address of region $1 holding IP $2 belongs to a tenant other than $3 (an ip
-- target of a load balancer must not be another tenant's address; index addresses_ip_live).
SELECT EXISTS (SELECT 1 FROM addresses WHERE region = $1 AND ip = $2::inet AND status <> 'deleted'
                                         AND tenant_id <> $3) AS held;

-- name: address_ip_holders
-- The live addresses of every region holding any of the IPs $1 (text[]): who holds each, as what
-- (kind load_balancer: a VIP or appliance address) and where. The ip-target rules of the API and of
-- every configure: an appliance's bridge may route to another region's addresses, so an IP held in
-- any region counts (regions may reuse a range: one IP can have a holder in each).
SELECT host(ip) AS ip, tenant_id, kind, region FROM addresses
WHERE ip = ANY($1::inet[]) AND status <> 'deleted';

-- fragment: free_ip_slot(pool)
-- The lowest free IP of pool <pool> (a CTE's body, `slot`), for every statement that allocates an
-- address (address_allocate, address_allocate_with_job, a load balancer's lb_address_allocate):
-- a row not held, not quarantined (reusable_after), that the pool still hands out (settings may
-- have reserved its IP or moved it out of the range while an address held it), not the gateway,
-- and whose IP no live address of the region holds (a pool renamed or replaced in the settings
-- has rows for IPs the disabled one's addresses still hold). Concurrent allocators skip each
-- other's locked rows instead of waiting.
SELECT i.pool_id, i.ip FROM address_pool_ips i JOIN address_pools p ON p.id = i.pool_id
WHERE i.pool_id = <pool> AND i.address_id IS NULL
  AND (i.reusable_after IS NULL OR i.reusable_after <= now())
  AND i.ip BETWEEN p.first_ip AND p.last_ip AND NOT (i.ip = ANY (p.reserved))
  AND i.ip IS DISTINCT FROM p.gateway
  AND NOT EXISTS (SELECT 1 FROM addresses a WHERE a.region = p.region AND a.ip = i.ip AND a.status <> 'deleted')
ORDER BY i.ip
LIMIT 1
FOR UPDATE OF i SKIP LOCKED

-- fragment: hold_slot(address)
-- The pool row of `slot` (free_ip_slot) now held by address <address>.
UPDATE address_pool_ips i SET address_id = <address>, reusable_after = NULL
FROM slot WHERE i.pool_id = slot.pool_id AND i.ip = slot.ip
RETURNING i.ip

-- name: address_quota_usage
-- The tenant's addresses' part of its quota use (after tenant_quota_lock, in a new statement):
-- its addresses not yet deleted, whoever holds them.
SELECT count(*) AS addresses FROM addresses WHERE tenant_id = $1 AND status <> 'deleted';
