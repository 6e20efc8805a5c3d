-- The load_balancer type's SQL (its tables), loaded with every other named query by z9.common.sql; called
-- through its store (z9.resources.load_balancer.store).

-- ---------------------------------------------------------------- load balancers (migration 0008)

-- name: lb_insert
INSERT INTO load_balancers (id, tenant_id, region, name, type, algorithm, services, targets, labels)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
RETURNING *;

-- name: lb_patch
-- Database-only changes (name, labels); NULL: unchanged. A deleted load balancer is not changed.
UPDATE load_balancers SET name = coalesce($3, name), labels = coalesce($4::jsonb, labels), updated_at = now()
WHERE id = $1 AND tenant_id = $2 AND status <> 'deleted'
RETURNING *;

-- name: lb_address_allocate
-- One address of load balancer $3 (member $4, NULL: the VIP) from pool $2: the lowest free IP,
-- as address_allocate, active at once (the load balancer's own jobs put it in place). As there,
-- only an IP the pool still hands out and no live address of the region holds.
WITH slot AS (
    {{free_ip_slot($2)}}
), adr AS (
    INSERT INTO addresses (id, tenant_id, region, pool_id, pool_name, prefix, gateway, ip, family, kind,
                           load_balancer_id, lb_member, status)
    SELECT $1, $5, p.region, p.id, p.name, masklen(p.cidr), p.gateway, slot.ip, p.family, 'load_balancer',
           $3, $4, 'active'
    FROM slot JOIN address_pools p ON p.id = slot.pool_id
    RETURNING *
), held AS (
    {{hold_slot($1)}}
)
SELECT adr.* FROM adr, held;

-- name: lb_set_addresses
UPDATE load_balancers SET addresses = $2, updated_at = now() WHERE id = $1 RETURNING *;

-- name: lb_get_for_update
SELECT * FROM load_balancers WHERE id = $1 AND tenant_id = $2 FOR UPDATE;

-- name: lb_change
-- An action: services, targets and algorithm as they are now (the configure job renders them).
UPDATE load_balancers
SET services = $2, targets = $3, algorithm = $4, config_version = config_version + 1, updated_at = now()
WHERE id = $1
RETURNING *;

-- name: lb_targeting_server
-- Every live load balancer naming server $1 as a target (GIN index load_balancers_targets).
SELECT * FROM load_balancers
WHERE targets @> jsonb_build_array(jsonb_build_object('server_id', $1::text)) AND status <> 'deleted';

-- name: lb_observed
-- What verify/observe saw: members ($2), health ($3, $4), the hash every appliance holds ($5,
-- NULL: leave it); the status $6 when the current one is in $7 (never over the deletion states).
UPDATE load_balancers
SET observed = $2, observed_at = now(), health = $3, health_detail = $4, health_at = now(),
    config_hash = coalesce($5, config_hash), updated_at = now(),
    status = {{status_if_allowed($6, $7, load_balancer_status)}},
    status_reason = {{reason_cleared_if_allowed($6, $7)}}
WHERE id = $1 AND status <> 'deleted'
RETURNING *;

-- name: lb_release_addresses
-- The final delete's finish (after verify saw the appliances gone): the VIP and appliance
-- addresses are deleted and their IPs go back to the pool, quarantined.
WITH gone AS (
    UPDATE addresses
    SET status = 'deleted', deleted_at = now(), observed = NULL, observed_at = now(), status_reason = NULL,
        updated_at = now()
    WHERE load_balancer_id = $1 AND status <> 'deleted'
      AND EXISTS (SELECT 1 FROM load_balancers l WHERE l.id = $1 AND l.status = 'deleted')
    RETURNING id
)
UPDATE address_pool_ips i
SET address_id = NULL, reusable_after = now() + make_interval(secs => p.quarantine_s)
FROM address_pools p, gone
WHERE i.address_id = gone.id AND p.id = i.pool_id
RETURNING host(i.ip) AS ip;

-- name: lb_servers
-- The target servers of a load balancer, as z9 knows them: status, power and primary IPv4.
SELECT id, status::text AS status, power_state, host(primary_ipv4) AS ip, region
FROM servers WHERE id = ANY($1::text[]);

-- name: load_balancer_quota_usage
-- The tenant's load balancers' part of its quota use (after tenant_quota_lock, in a new
-- statement): its load balancers not yet deleted (their addresses are counted as addresses).
SELECT count(*) AS load_balancers FROM load_balancers WHERE tenant_id = $1 AND status <> 'deleted';
