-- The vm_private_addresses table: the private-network address of each VM member (migration 0017).

-- ================================================================ VM private addresses (migration 0017)

-- name: vm_private_address_lock
-- Allocations of one region one at a time (in the allocating transaction).
SELECT pg_advisory_xact_lock(hashtextextended('z9-private-address:' || $1, 0));

-- name: vm_private_address_forget_expired
-- Released rows whose quarantine is over are no longer needed.
DELETE FROM vm_private_addresses WHERE region = $1 AND released_at IS NOT NULL AND reusable_after <= now();

-- name: vm_private_address_allocate
-- The member's live address; else the first free IP of the range (first $4, count $5, never one
-- of $6, nor live or quarantined in the region), taken for it. NULL: the network is exhausted.
WITH mine AS (
    SELECT ip FROM vm_private_addresses WHERE resource_id = $1 AND member = $2 AND released_at IS NULL
), pick AS (
    SELECT $4::inet + n AS ip FROM generate_series(0::bigint, $5::bigint - 1) AS n
    WHERE NOT EXISTS (SELECT 1 FROM mine)
      AND NOT ($4::inet + n = ANY($6::inet[]))
      AND NOT EXISTS (SELECT 1 FROM vm_private_addresses p WHERE p.region = $3 AND p.ip = $4::inet + n)
    LIMIT 1
), ins AS (
    INSERT INTO vm_private_addresses (resource_id, member, region, ip, quarantine_s)
    SELECT $1, $2, $3, ip, $7 FROM pick
    RETURNING ip
)
SELECT host(ip) FROM mine UNION ALL SELECT host(ip) FROM ins;

-- name: vm_private_addresses_of
-- The live private addresses of one resource's VMs: member, ip.
SELECT member, host(ip) AS ip FROM vm_private_addresses
WHERE resource_id = $1 AND released_at IS NULL ORDER BY member;

-- name: vm_private_address_release
-- The member's VM is gone: its address goes into quarantine.
UPDATE vm_private_addresses
SET released_at = now(), reusable_after = now() + make_interval(secs => quarantine_s)
WHERE resource_id = $1 AND member = $2 AND released_at IS NULL
RETURNING host(ip);
