-- Every SQL statement z9 runs, each under a `-- name: <table_verb>` header.
-- Loaded once by z9.common.sql; called only through the typed wrappers in z9.common.store.
-- Writes to a running job are fenced: WHERE id = $1 AND lease_owner = $2 AND attempt = $3
-- AND status = 'running'. Zero rows means the lease is lost. (Written `status::text = 'running'`:
-- the same test, but no partial index's predicate matches it, so the planner always probes the
-- primary key. With `status = 'running'` and statistics taken while no job was live, it chose
-- to scan every live job through jobs_resource_live — see bench/README.md.)
-- Every statement that changes a job's status or steps also runs
-- pg_notify('z9_job_changed', <job id>) (column `notified`): delivered at the commit the change
-- already makes, it wakes the API's long-polls (GET /v1/jobs/{id}?wait_s=) without an extra
-- commit. Heartbeats and memos change neither and notify nothing.

-- name: tenant_upsert
INSERT INTO tenants (id, name) VALUES ($1, $2)
ON CONFLICT (name) DO UPDATE SET name = EXCLUDED.name
RETURNING id, name;

-- name: api_token_insert
INSERT INTO api_tokens (id, tenant_id, name, token_sha256, scopes, expires_at, created_by)
VALUES ($1, $2, $3, $4, $5, $6, $7)
RETURNING id, tenant_id, name, scopes, created_at, expires_at, last_used_at, revoked_at, created_by;

-- name: api_token_tenant
SELECT t.id, t.name
FROM api_tokens k JOIN tenants t ON t.id = k.tenant_id
WHERE k.token_sha256 = $1 AND k.revoked_at IS NULL AND (k.expires_at IS NULL OR k.expires_at > coalesce($2::timestamptz, now()));

-- name: api_token_auth
-- The principal of a bearer token: unknown, revoked and expired tokens match nothing, nor does a
-- token any of whose ancestors (created_by, transitively: the token that made it, and so on) is
-- revoked or expired — a token never outlives its line. expires_at: the earliest along the line.
WITH RECURSIVE line AS (
    SELECT k.id, k.created_by, k.revoked_at, k.expires_at, 0 AS depth
    FROM api_tokens k WHERE k.token_sha256 = $1
    UNION ALL
    SELECT p.id, p.created_by, p.revoked_at, p.expires_at, line.depth + 1
    FROM api_tokens p JOIN line ON p.id = line.created_by
    WHERE line.depth < 100
)
SELECT k.id, k.tenant_id, k.scopes, (SELECT min(line.expires_at) FROM line) AS expires_at
FROM api_tokens k
WHERE k.token_sha256 = $1
  AND NOT EXISTS (SELECT 1 FROM line WHERE line.revoked_at IS NOT NULL OR line.expires_at <= coalesce($2::timestamptz, now()));

-- name: api_token_list
SELECT id, tenant_id, name, scopes, created_at, expires_at, last_used_at, revoked_at, created_by
FROM api_tokens
WHERE tenant_id = $1 AND ($2::text IS NULL OR id > $2) AND ($3 OR revoked_at IS NULL)
ORDER BY id
LIMIT $4;

-- name: api_token_revoke
-- Revoke token $1 of tenant $2 and every token it created, transitively (index
-- api_tokens_created_by). Revoking twice answers the tokens again (revoked_at unchanged): DELETE
-- is idempotent. Every row revoked (the token's own among them).
WITH RECURSIVE tree AS (
    SELECT id FROM api_tokens WHERE id = $1 AND tenant_id = $2
    UNION
    SELECT c.id FROM api_tokens c JOIN tree ON c.created_by = tree.id WHERE c.tenant_id = $2
)
UPDATE api_tokens k SET revoked_at = coalesce(k.revoked_at, now())
FROM tree WHERE k.id = tree.id
RETURNING k.id, k.tenant_id, k.name, k.scopes, k.created_at, k.expires_at, k.last_used_at, k.revoked_at,
          k.created_by;

-- name: api_token_touch
-- Coarse last use: only rows not touched within $2 seconds are written.
UPDATE api_tokens SET last_used_at = coalesce($3::timestamptz, now())
WHERE id = ANY($1::text[]) AND (last_used_at IS NULL OR last_used_at < coalesce($3::timestamptz, now()) - make_interval(secs => $2));

-- name: idempotency_lock
SELECT pg_advisory_xact_lock(hashtextextended($1, 31289));

-- name: idempotency_get
SELECT request_sha256, response_status, response_body
FROM idempotency_keys WHERE tenant_id = $1 AND key = $2;

-- name: idempotency_prune
DELETE FROM idempotency_keys WHERE created_at < coalesce($2::timestamptz, now()) - make_interval(secs => $1);

-- name: idempotency_insert
INSERT INTO idempotency_keys (tenant_id, key, request_sha256, response_status, response_body)
VALUES ($1, $2, $3, $4, $5);

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
    INSERT INTO jobs (id, kind, region, tenant_id, resource_type, resource_id, args, max_attempts, trace_context,
                      actor_token_id, request_id)
    SELECT $10, $11, s.region, s.tenant_id, 'server', s.id, $12, $13, $14, $15, $16 FROM s
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

-- ================================================================ resource lifecycle
-- Written once for every resource table: `{table}` is filled in by the resource-type registry
-- (z9.resources) with a table name it validated; the table keeps the lifecycle columns
-- (db/z9/db/migrations/0004_resource_layer.sql).

-- name: resource_get
SELECT * FROM {table} WHERE id = $1 AND ($2::text IS NULL OR tenant_id = $2);

-- name: resource_list
-- $5 a name, $6-$10 a label selector (every type has name and labels: lifecycle columns),
-- $11 false: not the deleted ones (a name lookup finds what is there now).
SELECT * FROM {table}
WHERE tenant_id = $1 AND ($2::text IS NULL OR id > $2) AND ($3::text IS NULL OR status::text = $3)
  AND ($5::text IS NULL OR name = $5)
  -- the label selector (z9.common.labels): $6 k=v, $7 k!=v, $8 k, $9 !k, $10 k in (…)
  AND labels @> $6::jsonb AND NOT (labels @> ANY($7::jsonb[])) AND labels ?& $8::text[]
  AND NOT (labels ?| $9::text[])
  AND NOT EXISTS (SELECT 1 FROM jsonb_array_elements($10::jsonb) r
                  WHERE NOT coalesce((r->'v') ? (labels->>(r->>'k')), false))
  AND ($11::bool OR status::text <> 'deleted')
ORDER BY id
LIMIT $4;

-- name: resource_mark_deleting
-- The deletion buffer starts; status_before_delete says what a cancellation restores.
UPDATE {table}
SET status = 'deleting',
    delete_after = coalesce($4::timestamptz, now()) + make_interval(secs => $3::float8),
    status_before_delete = status,
    updated_at = coalesce($4::timestamptz, now())
WHERE id = $1 AND tenant_id = $2 AND status NOT IN ('deleting', 'destroying', 'deleted')
RETURNING *;

-- name: resource_mark_destroying
-- An immediate deletion: straight to the final job.
UPDATE {table}
SET status = 'destroying',
    delete_after = NULL,
    status_before_delete = status,
    updated_at = now()
WHERE id = $1 AND tenant_id = $2 AND status NOT IN ('deleting', 'destroying', 'deleted')
RETURNING *;

-- name: resource_cancel_deletion
-- The status (the lifecycle state, not anything observed) goes back to what it was;
-- status_before_delete is kept: the restoring job is picked from it. A reason left by a failure
-- during the buffer goes, unless the resource was failed before.
UPDATE {table}
SET status = status_before_delete,
    status_reason = CASE WHEN status_before_delete = 'failed' THEN status_reason END,
    delete_after = NULL,
    updated_at = coalesce($3::timestamptz, now())
WHERE id = $1 AND tenant_id = $2 AND status = 'deleting' AND delete_after > coalesce($3::timestamptz, now())
RETURNING *;

-- name: resource_reap_expired
WITH due AS (
    SELECT id FROM {table}
    WHERE status = 'deleting' AND delete_after <= coalesce($2::timestamptz, now())
    ORDER BY delete_after
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)
UPDATE {table} s
SET status = 'destroying', updated_at = coalesce($2::timestamptz, now())
FROM due WHERE s.id = due.id
RETURNING s.*,
    -- the trace of the request that started the deletion (its first job, the resource's latest
    -- job): the final job continues it
    (SELECT j.trace_context FROM jobs j
     WHERE j.resource_id = s.id ORDER BY j.seq DESC LIMIT 1) AS deletion_trace_context;

-- name: resource_observed
-- Verify saw the resource now. $2: the status it established, applied only when the current
-- status is one of $3 (never over the deletion states).
UPDATE {table}
SET observed_at = now(), updated_at = now(),
    status = CASE WHEN $2::text IS NOT NULL AND status::text = ANY($3::text[])
                  THEN $2::text ELSE status::text END::{status_type},
    status_reason = CASE WHEN $2::text IS NOT NULL AND status::text = ANY($3::text[])
                         THEN NULL ELSE status_reason END
WHERE id = $1
RETURNING *;

-- name: resource_deleted
-- destroying → deleted; the clone requests of its VMs go with it.
WITH r AS (
    UPDATE {table}
    SET status = 'deleted', deleted_at = now(), status_reason = NULL, observed_at = now(), updated_at = now()
    WHERE id = $1 AND status = 'destroying'
    RETURNING id
), c AS (
    DELETE FROM vm_clone_requests WHERE resource_id IN (SELECT id FROM r)
), p AS (
    -- its VMs are gone (verify saw it): their private addresses go into quarantine
    UPDATE vm_private_addresses
    SET released_at = now(), reusable_after = now() + make_interval(secs => quarantine_s)
    WHERE resource_id IN (SELECT id FROM r) AND released_at IS NULL
)
SELECT count(*) FROM r;

-- name: resource_mark_failed
-- A failure during a deletion (buffer running, or final delete queued) leaves the deletion
-- going, unless $3: a deletion-guard refusal, or the final delete job itself failing, ends it.
-- The reason is kept either way.
UPDATE {table}
SET status = CASE WHEN status IN ('deleting', 'destroying') AND NOT $3 THEN status ELSE 'failed' END,
    status_reason = $2, updated_at = now()
WHERE id = $1 AND status <> 'deleted'
RETURNING id;

-- name: resource_periodic_due
-- Rows in a status of $1 not observed for $2 seconds and without a live job (their job's verify
-- observes them anyway), stalest first; locked for the enqueuing transaction, skipping rows
-- another reaper holds.
SELECT r.* FROM {table} r
WHERE r.status::text = ANY($1::text[])
  AND (r.observed_at IS NULL OR r.observed_at < coalesce($4::timestamptz, now()) - make_interval(secs => $2))
  AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.resource_id = r.id AND j.status IN ('pending', 'running', 'retry'))
ORDER BY r.observed_at NULLS FIRST
LIMIT $3
FOR UPDATE OF r SKIP LOCKED;

-- name: resource_count_live_jobs
-- Live (pending, running, retry) jobs holding a lock on one resource: as their own resource
-- (index-only on jobs_resource_live) or as an extra lock key (jobs_extra_locks_live).
SELECT (SELECT count(*) FROM jobs WHERE resource_id = $1 AND status IN ('pending', 'running', 'retry'))
     + (SELECT count(*) FROM jobs
        WHERE extra_lock_keys @> ARRAY[$1::text] AND cardinality(extra_lock_keys) > 0
          AND status IN ('pending', 'running', 'retry'));

-- name: resource_create_failed
-- Whether the resource's create ($2: its create kind) failed and never succeeded: a failed
-- create, nothing of it ever in use (its deletion needs no buffer). NULL (false) when no create
-- job is kept (pruned): the buffer then applies, as for any resource that may hold data.
SELECT bool_or(status = 'failed') AND NOT bool_or(status = 'succeeded')
FROM jobs WHERE resource_id = $1 AND kind = $2;

-- name: resource_latest_job_args
-- The args of the resource's latest job of kind $2 (NULL: none kept).
SELECT args FROM jobs WHERE resource_id = $1 AND kind = $2 ORDER BY seq DESC LIMIT 1;

-- name: resource_count_own_live_jobs
-- Live (pending, running, retry) jobs of resource $1 itself (index-only on jobs_resource_live).
SELECT count(*) FROM jobs WHERE resource_id = $1 AND status IN ('pending', 'running', 'retry');

-- ================================================================ VM clone requests

-- name: vm_clone_sent
-- Before the clone POST (fenced by the sender's lease): the request may be performed from now.
INSERT INTO vm_clone_requests (resource_id, member, vmid, node, job_id)
SELECT $4, $5, $6, $7, j.id FROM jobs j
WHERE j.id = $1 AND j.lease_owner = $2 AND j.attempt = $3 AND j.status::text = 'running'
ON CONFLICT (resource_id, member, vmid) DO UPDATE
SET node = EXCLUDED.node, job_id = EXCLUDED.job_id, sent_at = now(), lost_at = NULL, answered_at = NULL,
    upid = NULL
RETURNING vmid;

-- name: vm_clone_answered
-- The hypervisor answered with the clone task's UPID.
UPDATE vm_clone_requests SET answered_at = now(), upid = $4
WHERE resource_id = $1 AND member = $2 AND vmid = $3
RETURNING vmid;

-- name: vm_clone_lost
-- The sender saw the answer lost (timeout, connection dropped): the request was in flight until
-- now, and may still be performed.
UPDATE vm_clone_requests SET lost_at = now()
WHERE resource_id = $1 AND member = $2 AND vmid = $3 AND answered_at IS NULL
RETURNING vmid;

-- name: vm_clone_refused
-- The hypervisor refused the vmid (taken): nothing was cloned; the request is forgotten.
DELETE FROM vm_clone_requests WHERE resource_id = $1 AND member = $2 AND vmid = $3;

-- name: vm_clone_requests
-- The clone requests of one resource (every member, or one); uncertain_since, while no answer was
-- recorded, is when it was last known in flight (lost_at, else sent_at).
SELECT member, vmid, node, job_id, upid, extract(epoch FROM sent_at)::float8 AS sent_at,
       CASE WHEN answered_at IS NULL THEN extract(epoch FROM coalesce(lost_at, sent_at))::float8 END
           AS uncertain_since
FROM vm_clone_requests
WHERE resource_id = $1 AND ($2::text IS NULL OR member = $2)
ORDER BY member, sent_at, vmid;

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

-- name: job_insert
INSERT INTO jobs (id, kind, region, tenant_id, resource_type, resource_id, args, max_attempts, trace_context,
                  extra_lock_keys, actor_token_id, request_id)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)
RETURNING *;

-- name: job_insert_notify
-- job_insert and its NOTIFY (delivered at commit) in one statement: one round trip.
WITH ins AS (
    INSERT INTO jobs (id, kind, region, tenant_id, resource_type, resource_id, args, max_attempts, trace_context,
                      extra_lock_keys, actor_token_id, request_id)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)
    RETURNING *
)
SELECT ins.*, pg_notify('z9_jobs', ins.region)::text AS notified FROM ins;

-- name: job_insert_many
-- $10: each job's extra lock keys as a JSON array text (a text[][] would have to be rectangular).
INSERT INTO jobs (id, kind, region, tenant_id, resource_type, resource_id, args, max_attempts, trace_context,
                  extra_lock_keys, actor_token_id, request_id)
SELECT u.id, u.kind, u.region, u.tenant_id, u.resource_type, u.resource_id, u.args, u.max_attempts,
       u.trace_context, ARRAY(SELECT jsonb_array_elements_text(u.keys::jsonb)), u.actor_token_id, u.request_id
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::jsonb[], $8::int[],
            $9::jsonb[], $10::text[], $11::text[], $12::text[])
     AS u(id, kind, region, tenant_id, resource_type, resource_id, args, max_attempts, trace_context, keys,
          actor_token_id, request_id)
RETURNING *;

-- name: jobs_notify
SELECT pg_notify('z9_jobs', r) FROM unnest($1::text[]) AS r;

-- name: job_get
SELECT * FROM jobs WHERE id = $1 AND tenant_id = $2;

-- name: job_get_any
SELECT * FROM jobs WHERE id = $1;

-- name: job_list_for_resource
-- $6 a status, $7 a kind, $8 kinds left out (GET /v1/jobs's filters; every job_list* has them).
SELECT * FROM jobs
WHERE tenant_id = $1 AND resource_id = $2 AND ($3::bigint IS NULL OR seq > $3)
  AND ($5::text IS NULL OR actor_token_id = $5)
  AND ($6::text IS NULL OR status::text = $6) AND ($7::text IS NULL OR kind = $7) AND NOT (kind = ANY($8::text[]))
ORDER BY seq
LIMIT $4;

-- name: job_list_for_resource_newest
-- job_list_for_resource newest first: $3 the position the page starts before.
SELECT * FROM jobs
WHERE tenant_id = $1 AND resource_id = $2 AND ($3::bigint IS NULL OR seq < $3)
  AND ($5::text IS NULL OR actor_token_id = $5)
  AND ($6::text IS NULL OR status::text = $6) AND ($7::text IS NULL OR kind = $7) AND NOT (kind = ANY($8::text[]))
ORDER BY seq DESC
LIMIT $4;

-- name: job_list
-- $4: only the jobs asked for by that token (no index of its own: see migration 0007); $5 a
-- status, $6 a kind, $7 kinds left out (the periodic observe-only ones, unless asked for).
SELECT * FROM jobs
WHERE tenant_id = $1 AND ($2::bigint IS NULL OR seq > $2) AND ($4::text IS NULL OR actor_token_id = $4)
  AND ($5::text IS NULL OR status::text = $5) AND ($6::text IS NULL OR kind = $6) AND NOT (kind = ANY($7::text[]))
ORDER BY seq
LIMIT $3;

-- name: job_list_newest
-- job_list newest first (jobs_tenant walked backwards): $2 the position the page starts before.
SELECT * FROM jobs
WHERE tenant_id = $1 AND ($2::bigint IS NULL OR seq < $2) AND ($4::text IS NULL OR actor_token_id = $4)
  AND ($5::text IS NULL OR status::text = $5) AND ($6::text IS NULL OR kind = $6) AND NOT (kind = ANY($7::text[]))
ORDER BY seq DESC
LIMIT $3;

-- name: job_claim
-- No parameters: {region}, {limit}, {owner}, {lease_ttl_s} and {now} (NULL: the server's now(); a
-- test clock's time otherwise) are filled in as literals (sql.ql), so
-- PostgreSQL plans this statement once per connection and keeps the plan (force_custom_plan only
-- re-plans statements with parameters), and that plan knows the real LIMIT: a generic plan of a
-- `LIMIT $n` parameter assumes a tenth of the rows and could trade the ordered walk below for a sort of every
-- pending job. Planning was about half of the server's time per job at concurrency 1 (issue 14).
-- The earliest pending jobs of one region whose lock keys no earlier live job holds (per-resource
-- order, extended to a job's extra_lock_keys), oldest first. `NOT blocked` (migration 0010): jobs
-- waiting behind a live job of one of their keys are not in jobs_claimable at all, so the walk never
-- steps over them; the checks below stay as a guard: `region = {region}` (a scalar, not
-- `= ANY(array)`) lets the scan walk jobs_claimable in seq order and stop after {limit} rows; with an
-- array PostgreSQL 15 cannot take the order from that index and walks every finished job. The
-- check for an earlier live job of the candidate's resource is a correlated subplan probing
-- jobs_resource_live by resource_id (skipped for jobs without a resource): written as an
-- anti-join, stale statistics (a queue table that looked empty at its last ANALYZE) made the
-- planner scan the whole live index for every candidate. The other keys — a candidate's extra
-- keys, and earlier jobs holding its keys as extra keys — are checked by jobs_lock_held
-- (migration 0004), only for a candidate with extra keys or while any live job has some (one
-- probe of jobs_multikey_live per claim). Jobs wait only for earlier jobs (a total order), so
-- there is no lock cycle.
WITH candidates AS (
    SELECT j.id FROM jobs j
    WHERE j.status = 'pending' AND NOT j.blocked AND j.region = {region} AND j.run_after <= coalesce({now}::timestamptz, now())
      AND (j.resource_id IS NULL OR (
          NOT EXISTS (
              SELECT 1 FROM jobs e
              WHERE e.resource_id = j.resource_id AND e.seq < j.seq
                AND e.status IN ('pending', 'running', 'retry'))
          AND ((cardinality(j.extra_lock_keys) = 0
                AND NOT (SELECT EXISTS (SELECT 1 FROM jobs x WHERE cardinality(x.extra_lock_keys) > 0
                                                                AND x.status IN ('pending', 'running', 'retry'))))
               OR NOT jobs_lock_held(j.resource_id, j.extra_lock_keys, j.seq))))
    ORDER BY j.seq
    LIMIT {limit}
    FOR UPDATE SKIP LOCKED
)
UPDATE jobs
SET status = 'running',
    attempt = jobs.attempt + 1,
    lease_owner = {owner},
    lease_expires_at = coalesce({now}::timestamptz, now()) + make_interval(secs => {lease_ttl_s}),
    started_at = coalesce(jobs.started_at, {now}::timestamptz, now()),
    updated_at = coalesce({now}::timestamptz, now())
FROM candidates
WHERE jobs.id = candidates.id
RETURNING jobs.*, pg_notify('z9_job_changed', jobs.id)::text AS notified;

-- name: job_region_cap_lock
-- The per-region cap (RegionSettings.max_concurrent_jobs; store.job_claim): the transaction-scoped
-- advisory lock of each region of $1 (the caller sorts them, and unnest keeps that order, so two
-- transactions locking several regions never wait on each other in a cycle). Held to commit: a
-- capped claim counts the region's running jobs (job_region_running, a later statement, so its
-- snapshot sees every claim committed before the lock was granted) and claims at most the rest.
-- Taken last in any transaction (after a finish's rows and key locks), and nothing waits while
-- holding it but its own SKIP LOCKED claim and the commit. Works behind a transaction pooler.
SELECT pg_advisory_xact_lock(hashtextextended('z9-region-cap:' || r, 0)) FROM unnest($1::text[]) AS r;

-- name: job_region_running
-- Running jobs of region $1 whose lease has not expired (a dead executor's jobs stop counting when
-- their leases expire, before the scheduler reclaims them). The planner walks jobs_lease_expiry
-- (running jobs only, every region: 0.8 ms for 2,000 running jobs, measured) — bounded by the
-- executors' total concurrency, never by the table's size.
SELECT count(*)::int FROM jobs WHERE status = 'running' AND region = $1 AND lease_expires_at > coalesce($2::timestamptz, now());

-- name: job_region_claimable
-- Whether region $1 has a claimable-looking job (pending, not blocked, due): one probe of
-- jobs_claimable, asked only when the cap held a claim back (for the metric and the log line).
SELECT EXISTS (SELECT 1 FROM jobs WHERE status = 'pending' AND NOT blocked AND region = $1 AND run_after <= coalesce($2::timestamptz, now()));

-- name: jobs_unblock_now
-- Inside a transaction that ended jobs with resources: run their deferred unblocking
-- (jobs_unblock_after_end, migration 0010) now, so a claim later in the same transaction can take
-- the jobs that waited on them. Issued after the finishes' records, so the advisory key locks come
-- after every row lock the transaction takes (an API transaction takes a resource row, then a key).
SET CONSTRAINTS jobs_unblock_after_end, jobs_unblock_after_delete IMMEDIATE;

-- name: jobs_unblock_missed
-- The scheduler's safety net (at its prune cadence): blocked pending jobs that no earlier live job
-- holds a key of any more — which the triggers of migration 0010 should never leave — are made
-- claimable and their regions notified. SKIP LOCKED: never waits on a row in use.
WITH missed AS (
    SELECT j.id FROM jobs j
    WHERE j.status = 'pending' AND j.blocked AND NOT jobs_key_held(j.resource_id, j.extra_lock_keys, j.seq)
    ORDER BY j.seq
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)
UPDATE jobs SET blocked = false
FROM missed
WHERE jobs.id = missed.id AND jobs.blocked AND jobs.status = 'pending'
RETURNING jobs.id, jobs.region, pg_notify('z9_jobs', jobs.region)::text AS notified;

-- name: job_heartbeat
-- An expired lease is lost even before the scheduler reclaims it: its slot under a region's cap
-- may already be another executor's (the cap counts unexpired leases), so a holder that wakes up
-- late (frozen, partitioned) must stop, not renew — JobContext.fence() runs this before every
-- mutating hypervisor call.
UPDATE jobs
SET lease_expires_at = coalesce($5::timestamptz, now()) + make_interval(secs => $4::float8), updated_at = coalesce($5::timestamptz, now())
WHERE id = $1 AND lease_owner = $2 AND attempt = $3 AND status::text = 'running'
  AND lease_expires_at > coalesce($5::timestamptz, now())
RETURNING id;

-- name: job_heartbeat_many
-- Batch renewal: ($1 ids, $2 owners, $3 attempts) fenced row by row; returns the (id, attempt)
-- of the leases still held — a lease missing from the answer is lost. Never waits on a row lock:
-- a row another transaction holds (this executor's own finish waiting on a lock, a frozen API
-- process) is skipped and answered from the statement's snapshot (still ours: not lost, renewed
-- at the next beat) — one locked row must not hold up every other job's renewal. An expired lease
-- is lost (see job_heartbeat).
-- `status::text`: the same test, but it matches no partial index's predicate, so the planner
-- probes the primary key for the ids — stale statistics would otherwise have it scan every live
-- job through jobs_resource_live.
WITH f AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::int[]) AS f(id, owner, attempt)
), held AS (
    SELECT j.id FROM jobs j JOIN f ON j.id = f.id
    WHERE j.id = ANY($1::text[]) AND j.lease_owner = f.owner AND j.attempt = f.attempt
      AND j.status::text = 'running' AND j.lease_expires_at > coalesce($5::timestamptz, now())
    FOR UPDATE OF j SKIP LOCKED
), renewed AS (
    UPDATE jobs j
    SET lease_expires_at = coalesce($5::timestamptz, now()) + make_interval(secs => $4::float8), updated_at = coalesce($5::timestamptz, now())
    FROM held
    WHERE j.id = ANY(ARRAY(SELECT id FROM held)) AND j.id = held.id
    RETURNING j.id, j.attempt
)
SELECT id, attempt FROM renewed
UNION ALL
SELECT j.id, j.attempt FROM jobs j JOIN f ON j.id = f.id
WHERE j.id = ANY($1::text[]) AND j.lease_owner = f.owner AND j.attempt = f.attempt
  AND j.status::text = 'running' AND j.lease_expires_at > coalesce($5::timestamptz, now()) AND j.id NOT IN (SELECT id FROM held);

-- name: job_progress
-- Renews the lease, so an expired one is lost here too (see job_heartbeat): step_running writes
-- before the step's fence.
UPDATE jobs
SET steps = $4, lease_expires_at = coalesce($6::timestamptz, now()) + make_interval(secs => $5), updated_at = coalesce($6::timestamptz, now())
WHERE id = $1 AND lease_owner = $2 AND attempt = $3 AND status::text = 'running'
  AND lease_expires_at > coalesce($6::timestamptz, now())
RETURNING id, pg_notify('z9_job_changed', jobs.id)::text AS notified;

-- name: job_remember
-- Renews the lease: an expired one is lost (see job_heartbeat).
UPDATE jobs
SET memo = memo || $4::jsonb, lease_expires_at = coalesce($6::timestamptz, now()) + make_interval(secs => $5), updated_at = coalesce($6::timestamptz, now())
WHERE id = $1 AND lease_owner = $2 AND attempt = $3 AND status::text = 'running'
  AND lease_expires_at > coalesce($6::timestamptz, now())
RETURNING id;

-- name: job_succeed
UPDATE jobs
SET status = 'succeeded', steps = $4, error = NULL, lease_owner = NULL, lease_expires_at = NULL,
    finished_at = now(), updated_at = now()
WHERE id = $1 AND lease_owner = $2 AND attempt = $3 AND status::text = 'running'
RETURNING id, pg_notify('z9_job_changed', jobs.id)::text AS notified;

-- name: job_succeed_many
-- Batch finish of concurrent jobs: ($1 ids, $2 owners, $3 attempts, $4 steps) fenced row by
-- row like job_succeed; returns the (id, attempt) of the rows that matched — a job missing
-- from the answer has lost its lease. Steps come as JSON text ($4 text[]): a jsonb[] of lists
-- would be read by the driver as a multi-dimensional array.
UPDATE jobs j
SET status = 'succeeded', steps = f.steps::jsonb, error = NULL, lease_owner = NULL, lease_expires_at = NULL,
    finished_at = now(), updated_at = now()
FROM unnest($1::text[], $2::text[], $3::int[], $4::text[]) AS f(id, owner, attempt, steps)
-- `status::text`: the same test, but it matches no partial index's predicate, so the planner
-- probes the primary key for the ids — stale statistics would otherwise have it scan every live
-- job through jobs_resource_live.
WHERE j.id = ANY($1::text[])
  AND j.id = f.id AND j.lease_owner = f.owner AND j.attempt = f.attempt AND j.status::text = 'running'
RETURNING j.id, j.attempt, pg_notify('z9_job_changed', j.id)::text AS notified;

-- name: job_finish_and_claim
-- The executor's finish of jobs whose kinds record nothing (fenced like job_succeed_many) and its
-- next claim of up to $6 jobs of region $5 ($5 NULL: none), in one statement: one round trip,
-- one commit (the function jobs_finish_and_claim, migration 0012, says how). One row per finished
-- job (finished_id, finished_attempt; a lease missing from them is lost), then one per claimed
-- job (its columns; finished_id NULL).
SELECT f.finished_id, f.finished_attempt, (f.claimed).*
FROM jobs_finish_and_claim($1::text[], $2::text[], $3::int[], $4::text[], $5::text, $6::int, $7::text, $8::float8) AS f;

-- name: job_retry
-- $7 = attempts to give back (1 for a snooze or a hand-over, else 0).
UPDATE jobs
SET status = 'retry', steps = $4, error = $5,
    run_after = coalesce($8::timestamptz, now()) + make_interval(secs => $6),
    attempt = attempt - $7,
    lease_owner = NULL, lease_expires_at = NULL, updated_at = coalesce($8::timestamptz, now())
WHERE id = $1 AND lease_owner = $2 AND attempt = $3 AND status::text = 'running'
RETURNING id, run_after, pg_notify('z9_job_changed', jobs.id)::text AS notified;

-- name: job_fail
UPDATE jobs
SET status = 'failed', steps = $4, error = $5, lease_owner = NULL, lease_expires_at = NULL,
    finished_at = now(), updated_at = now()
WHERE id = $1 AND lease_owner = $2 AND attempt = $3 AND status::text = 'running'
RETURNING id, pg_notify('z9_job_changed', jobs.id)::text AS notified;

-- name: scheduler_notify
SELECT pg_notify('z9_scheduler', '');

-- name: job_retry_due
WITH due AS (
    SELECT id FROM jobs
    WHERE status = 'retry' AND run_after <= coalesce($2::timestamptz, now())
    ORDER BY run_after
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)
UPDATE jobs SET status = 'pending', updated_at = coalesce($2::timestamptz, now())
FROM due WHERE jobs.id = due.id
RETURNING jobs.id, jobs.region, pg_notify('z9_job_changed', jobs.id)::text AS notified;

-- name: job_retry_next_in
-- Seconds until the earliest retry is due (negative when overdue), NULL when none waits.
SELECT extract(epoch FROM min(run_after) - coalesce($1::timestamptz, now()))::float8 FROM jobs WHERE status = 'retry';

-- name: lease_reclaim_expired
-- Guarded: FOR UPDATE re-evaluates the CTE's predicate on a row changed since the snapshot,
-- and the outer WHERE repeats it on the locked row (belt and braces), so a job that finished
-- between selection and update is never overwritten.
WITH expired AS (
    SELECT id FROM jobs
    WHERE status = 'running' AND lease_expires_at < coalesce($2::timestamptz, now())
    ORDER BY lease_expires_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)
UPDATE jobs
SET status = CASE WHEN jobs.attempt >= jobs.max_attempts THEN 'failed' ELSE 'retry' END::job_status,
    error = jsonb_build_object(
        'class', 'temporary',
        'message', CASE WHEN jobs.attempt >= jobs.max_attempts
                        THEN 'out of attempts (' || jobs.max_attempts || '): '
                        ELSE '' END
                   || 'lease of ' || jobs.lease_owner || ' expired at '
                   || to_char(jobs.lease_expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')
                   || ' (worker lost or stalled)',
        'at', coalesce($2::timestamptz, now())),
    run_after = coalesce($2::timestamptz, now()),
    finished_at = CASE WHEN jobs.attempt >= jobs.max_attempts THEN coalesce($2::timestamptz, now()) END,
    lease_owner = NULL,
    lease_expires_at = NULL,
    updated_at = coalesce($2::timestamptz, now())
FROM expired
WHERE jobs.id = ANY(ARRAY(SELECT id FROM expired))  -- primary-key probes, not a scan of live jobs
  AND jobs.id = expired.id AND jobs.status::text = 'running' AND jobs.lease_expires_at < coalesce($2::timestamptz, now())
RETURNING jobs.id, jobs.kind, jobs.status, jobs.region, jobs.attempt, jobs.resource_type, jobs.resource_id,
          jobs.error, pg_notify('z9_job_changed', jobs.id)::text AS notified;

-- name: job_prune_finished
-- Terminal jobs past the retention; nothing outside the job table decides (what a later job needs
-- to know — clone requests — lives in its own table).
DELETE FROM jobs
WHERE id IN (
    SELECT j.id FROM jobs j
    WHERE j.status IN ('succeeded', 'failed') AND j.finished_at < coalesce($3::timestamptz, now()) - make_interval(secs => $1)
    ORDER BY j.finished_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
);

-- name: job_count_live
-- z9_jobs for the live statuses: an Index Only Scan of jobs_resource_live (status, region, kind
-- INCLUDEd, migration 0012).
SELECT kind, region, status::text AS status, count(*) AS n
FROM jobs
WHERE status IN ('pending', 'running', 'retry')
GROUP BY status, region, kind;

-- name: job_count_finished
-- z9_jobs for the finished statuses: an Index Only Scan of jobs_finished (status, region, kind
-- INCLUDEd, migration 0012); most of the table, so the scheduler runs it less often.
SELECT kind, region, status::text AS status, count(*) AS n
FROM jobs
WHERE status IN ('succeeded', 'failed')
GROUP BY status, region, kind;

-- name: job_oldest_pending_age
-- z9_job_oldest_pending_age_seconds for each region of $1: seconds since the oldest runnable
-- pending job became runnable (max(created_at, run_after)), 0 when none. Runnable: due, and no
-- earlier live job holds one of its lock keys (what job_claim may take). Walks
-- jobs_pending_runnable in run_after order and stops at the first runnable job; the walk and the
-- per-resource probes are index-only.
-- (run_after is never earlier than created_at: it defaults to now() and only moves forward.)
SELECT r.region, coalesce(extract(epoch FROM coalesce($2::timestamptz, now()) - (
    SELECT greatest(j.created_at, j.run_after) FROM jobs j
    WHERE j.status = 'pending' AND NOT j.blocked AND j.region = r.region AND j.run_after <= coalesce($2::timestamptz, now())
      AND NOT EXISTS (
          SELECT 1 FROM jobs e
          WHERE e.resource_id = j.resource_id AND e.seq < j.seq
            AND e.status IN ('pending', 'running', 'retry'))
      AND (j.resource_id IS NULL
           OR (cardinality(j.extra_lock_keys) = 0
               AND NOT (SELECT EXISTS (SELECT 1 FROM jobs x WHERE cardinality(x.extra_lock_keys) > 0
                                                               AND x.status IN ('pending', 'running', 'retry'))))
           OR NOT jobs_lock_held(j.resource_id, j.extra_lock_keys, j.seq))
    ORDER BY j.run_after
    LIMIT 1)), 0)::float8 AS age_s
FROM unnest($1::text[]) AS r(region);

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
    SELECT i.pool_id, i.ip FROM address_pool_ips i JOIN address_pools p ON p.id = i.pool_id
    WHERE i.pool_id = $2 AND i.address_id IS NULL
      AND (i.reusable_after IS NULL OR i.reusable_after <= now())
      AND i.ip BETWEEN p.first_ip AND p.last_ip AND NOT (i.ip = ANY (p.reserved))
      AND i.ip IS DISTINCT FROM p.gateway
      AND NOT EXISTS (SELECT 1 FROM addresses a WHERE a.region = p.region AND a.ip = i.ip AND a.status <> 'deleted')
    ORDER BY i.ip
    LIMIT 1
    FOR UPDATE OF i SKIP LOCKED
), adr AS (
    INSERT INTO addresses (id, tenant_id, region, pool_id, pool_name, prefix, gateway, ip, family, kind,
                           name, dns_ptr, protect_delete, auto_delete, server_id)
    SELECT $1, $3, p.region, p.id, p.name, masklen(p.cidr), p.gateway, slot.ip, p.family, $4,
           $5, $6, $7, $8, $9
    FROM slot JOIN address_pools p ON p.id = slot.pool_id
    RETURNING *
), held AS (
    UPDATE address_pool_ips i SET address_id = $1, reusable_after = NULL
    FROM slot WHERE i.pool_id = slot.pool_id AND i.ip = slot.ip
    RETURNING i.ip
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
    status = CASE WHEN $3::address_status IS NOT NULL AND status = ANY($4::address_status[])
                  THEN $3::address_status ELSE status END,
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
    -- as address_allocate: only IPs the pool still hands out and no live address holds
    SELECT i.pool_id, i.ip FROM address_pool_ips i JOIN address_pools p ON p.id = i.pool_id
    WHERE i.pool_id = (SELECT id FROM pool) AND i.address_id IS NULL
      AND (i.reusable_after IS NULL OR i.reusable_after <= now())
      AND i.ip BETWEEN p.first_ip AND p.last_ip AND NOT (i.ip = ANY (p.reserved))
      AND i.ip IS DISTINCT FROM p.gateway
      AND NOT EXISTS (SELECT 1 FROM addresses a WHERE a.region = $2 AND a.ip = i.ip AND a.status <> 'deleted')
    ORDER BY i.ip
    LIMIT 1
    FOR UPDATE OF i SKIP LOCKED
), adr AS (
    INSERT INTO addresses (id, tenant_id, region, pool_id, pool_name, prefix, gateway, ip, family, kind,
                           name, dns_ptr, protect_delete, auto_delete, server_id)
    SELECT $1, $3, p.region, p.id, p.name, masklen(p.cidr), p.gateway, slot.ip, p.family, $4,
           $5, $6, $7, $8, $9
    FROM slot JOIN address_pools p ON p.id = slot.pool_id
    RETURNING *
), held AS (
    UPDATE address_pool_ips i SET address_id = $1, reusable_after = NULL
    FROM slot WHERE i.pool_id = slot.pool_id AND i.ip = slot.ip
    RETURNING i.ip
), j AS (
    INSERT INTO jobs (id, kind, region, tenant_id, resource_type, resource_id, args, max_attempts, trace_context,
                      extra_lock_keys, actor_token_id, request_id)
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

-- name: job_args_merge
-- Add keys to a job's args before its transaction commits (a server create with a primary
-- address: the address is allocated after the server and its job were inserted).
UPDATE jobs SET args = args || $2::jsonb WHERE id = $1 AND status = 'pending';

-- name: address_make_primary
-- An unassigned address becomes server $2's primary (POST /v1/servers with public_ipv4: <id>).
UPDATE addresses SET kind = 'primary', server_id = $2, updated_at = now()
WHERE id = $1 AND server_id IS NULL AND status IN ('creating', 'active')
RETURNING *;

-- name: tenant_quota_get
-- A tenant's quota overrides (no row: none).
SELECT servers, cores, memory_mib, addresses, load_balancers FROM tenant_quotas WHERE tenant_id = $1;

-- name: tenant_quota_set
-- `z9 quota`: $3..$7 with $2 telling which are given (a NULL given resets it to the default).
INSERT INTO tenant_quotas AS t (tenant_id, servers, cores, memory_mib, addresses, load_balancers)
VALUES ($1, CASE WHEN 'servers' = ANY($2::text[]) THEN $3::integer END, CASE WHEN 'cores' = ANY($2::text[]) THEN $4::integer END,
        CASE WHEN 'memory_mib' = ANY($2::text[]) THEN $5::bigint END, CASE WHEN 'addresses' = ANY($2::text[]) THEN $6::integer END,
        CASE WHEN 'load_balancers' = ANY($2::text[]) THEN $7::integer END)
ON CONFLICT (tenant_id) DO UPDATE
SET servers = CASE WHEN 'servers' = ANY($2::text[]) THEN $3::integer ELSE t.servers END,
    cores = CASE WHEN 'cores' = ANY($2::text[]) THEN $4::integer ELSE t.cores END,
    memory_mib = CASE WHEN 'memory_mib' = ANY($2::text[]) THEN $5::bigint ELSE t.memory_mib END,
    addresses = CASE WHEN 'addresses' = ANY($2::text[]) THEN $6::integer ELSE t.addresses END,
    load_balancers = CASE WHEN 'load_balancers' = ANY($2::text[]) THEN $7::integer ELSE t.load_balancers END,
    updated_at = now()
RETURNING servers, cores, memory_mib, addresses, load_balancers;

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
       (SELECT count(*) FROM load_balancers WHERE tenant_id = $1 AND status <> 'deleted') AS load_balancers;

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

-- name: job_get_for_update
SELECT * FROM jobs WHERE id = $1 AND tenant_id = $2 FOR UPDATE;

-- name: job_failed_primary_assign_of_server
-- The failed job (kind $2: AddressAssign) that is the latest job of server $1's primary address
-- and was to put it on that server: a re-run of the server's failed create re-runs it too.
SELECT j.id
FROM addresses a
CROSS JOIN LATERAL (SELECT id, kind, status, args FROM jobs
                    WHERE resource_id = a.id ORDER BY seq DESC LIMIT 1) j
WHERE a.server_id = $1 AND a.kind = 'primary'
  AND j.kind = $2 AND j.status = 'failed' AND j.args ->> 'server_id' = $1;

-- name: job_cancel
-- A job that has not started (pending) or waits between attempts (retry) ends failed with
-- error class `cancelled`; a running job is never touched here (its steps act on the world).
UPDATE jobs
SET status = 'failed', error = $3, finished_at = now(), updated_at = now()
WHERE id = $1 AND tenant_id = $2 AND status IN ('pending', 'retry')
RETURNING *, pg_notify('z9_job_changed', jobs.id)::text AS notified;
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
    SELECT i.pool_id, i.ip FROM address_pool_ips i JOIN address_pools p ON p.id = i.pool_id
    WHERE i.pool_id = $2 AND i.address_id IS NULL
      AND (i.reusable_after IS NULL OR i.reusable_after <= now())
      AND i.ip BETWEEN p.first_ip AND p.last_ip AND NOT (i.ip = ANY (p.reserved))
      AND i.ip IS DISTINCT FROM p.gateway
      AND NOT EXISTS (SELECT 1 FROM addresses a WHERE a.region = p.region AND a.ip = i.ip AND a.status <> 'deleted')
    ORDER BY i.ip
    LIMIT 1
    FOR UPDATE OF i SKIP LOCKED
), adr AS (
    INSERT INTO addresses (id, tenant_id, region, pool_id, pool_name, prefix, gateway, ip, family, kind,
                           load_balancer_id, lb_member, status)
    SELECT $1, $5, p.region, p.id, p.name, masklen(p.cidr), p.gateway, slot.ip, p.family, 'load_balancer',
           $3, $4, 'active'
    FROM slot JOIN address_pools p ON p.id = slot.pool_id
    RETURNING *
), held AS (
    UPDATE address_pool_ips i SET address_id = $1, reusable_after = NULL
    FROM slot WHERE i.pool_id = slot.pool_id AND i.ip = slot.ip
    RETURNING i.ip
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
    status = CASE WHEN $6::text IS NOT NULL AND status::text = ANY($7::text[])
                  THEN $6::load_balancer_status ELSE status END,
    status_reason = CASE WHEN $6::text IS NOT NULL AND status::text = ANY($7::text[])
                         THEN NULL ELSE status_reason END
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

-- name: lb_servers
-- The target servers of a load balancer, as z9 knows them: status, power and primary IPv4.
SELECT id, status::text AS status, power_state, host(primary_ipv4) AS ip, region
FROM servers WHERE id = ANY($1::text[]);

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

-- name: jobs_supersede_waiting
-- In the transaction that enqueues job $2 (an immediate deletion): the resource's jobs of kinds $3
-- enqueued before it that are not running end failed with error $4 (class `cancelled`, naming $2).
UPDATE jobs j
SET status = 'failed', error = $4, finished_at = now(), updated_at = now()
FROM jobs me
WHERE me.id = $2 AND j.resource_id = $1 AND j.seq < me.seq AND j.kind = ANY($3::text[])
  AND j.status IN ('pending', 'retry')
RETURNING j.id, pg_notify('z9_job_changed', j.id)::text AS notified;

-- name: cluster_degraded_reason
-- What an observation found missing, on a cluster it left degraded.
UPDATE clusters SET status_reason = $2 WHERE id = $1 AND status = 'degraded';

-- name: job_superseding
-- The first job enqueued after job $1 on its resource whose kind ($2) supersedes it.
SELECT j.id, j.kind FROM jobs j JOIN jobs me ON me.id = $1
WHERE j.resource_id = me.resource_id AND j.seq > me.seq AND j.kind = ANY($2::text[])
ORDER BY j.seq
LIMIT 1;

-- ---------------------------------------------------------------- operator views (GET /v1/operator/…)

-- name: job_list_operator
-- Every tenant's jobs: $1 region, $2 kind, $3 status, $4 tenant (each NULL: any), $5 the limit, $6 kinds
-- left out. The live ones first — retry, then pending, then running, each oldest first — then the
-- finished ones, newest first.
SELECT * FROM jobs
WHERE ($1::text IS NULL OR region = $1) AND ($2::text IS NULL OR kind = $2)
  AND ($3::text IS NULL OR status::text = $3) AND ($4::text IS NULL OR tenant_id = $4)
  AND NOT (kind = ANY($6::text[]))
ORDER BY CASE status::text WHEN 'retry' THEN 0 WHEN 'pending' THEN 1 WHEN 'running' THEN 2 ELSE 3 END,
         CASE WHEN status::text IN ('retry', 'pending', 'running') THEN seq END,
         seq DESC
LIMIT $5;

-- name: job_live_counts_by_region
-- The live jobs of every region by status, with the oldest pending one's creation.
SELECT region, status::text AS status, count(*)::int AS n, min(created_at) AS oldest
FROM jobs WHERE status IN ('pending', 'retry', 'running')
GROUP BY region, status;

-- name: job_list_guard_refusals
-- Jobs the deletion guard refused (the executor marks their error `refused`), newest first.
SELECT * FROM jobs
WHERE status = 'failed' AND (error ->> 'refused') = 'true' AND ($1::text IS NULL OR region = $1)
ORDER BY seq DESC
LIMIT $2;

-- name: console_session_insert
INSERT INTO console_sessions (session_sha256, token_id, created_at, expires_at)
VALUES ($1, $2, coalesce($4::timestamptz, now()),
        coalesce($4::timestamptz, now()) + make_interval(secs => least($3::float8, $5::float8)))
RETURNING expires_at;

-- name: console_session_resolve
-- A live session ($1: its id's SHA-256) and its token's hash; its expiry moves to now + $3 s (the
-- idle cap, never past created_at + $4 s) when that is more than a minute later than it is.
UPDATE console_sessions s
SET expires_at = CASE WHEN s.expires_at < least(coalesce($2::timestamptz, now()) + make_interval(secs => $3::float8),
                                               s.created_at + make_interval(secs => $4::float8)) - interval '60 seconds'
                      THEN least(coalesce($2::timestamptz, now()) + make_interval(secs => $3::float8),
                                 s.created_at + make_interval(secs => $4::float8))
                      ELSE s.expires_at END
FROM api_tokens k
WHERE s.session_sha256 = $1 AND k.id = s.token_id AND s.revoked_at IS NULL
  AND s.expires_at > coalesce($2::timestamptz, now())
RETURNING s.token_id, k.token_sha256, s.expires_at;

-- name: console_session_revoke
UPDATE console_sessions SET revoked_at = coalesce(revoked_at, coalesce($2::timestamptz, now()))
WHERE session_sha256 = $1
RETURNING token_id;

-- name: console_session_prune
-- Sessions ended (expired, or signed out) more than $1 seconds ago.
DELETE FROM console_sessions
WHERE expires_at < coalesce($2::timestamptz, now()) - make_interval(secs => $1::float8)
   OR revoked_at < coalesce($2::timestamptz, now()) - make_interval(secs => $1::float8);
