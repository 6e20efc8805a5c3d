-- Every SQL statement z9 runs, each under a `-- name: <table_verb>` header.
-- Loaded once by z9.common.sql; called only through the typed wrappers in z9.common.store.
-- Writes to a running job are fenced: WHERE id = $1 AND lease_owner = $2 AND attempt = $3
-- AND status = 'running'. Zero rows means the lease is lost. (Written `status::text = 'running'`:
-- the same test, but no partial index's predicate matches it, so the planner always probes the
-- primary key. With `status = 'running'` and statistics taken while no job was live, it chose
-- to scan every live job through jobs_resource_live — see bench/README.md.)

-- name: tenant_upsert
INSERT INTO tenants (id, name) VALUES ($1, $2)
ON CONFLICT (name) DO UPDATE SET name = EXCLUDED.name
RETURNING id, name;

-- name: api_token_insert
INSERT INTO api_tokens (id, tenant_id, name, token_sha256) VALUES ($1, $2, $3, $4);

-- name: api_token_tenant
SELECT t.id, t.name
FROM api_tokens k JOIN tenants t ON t.id = k.tenant_id
WHERE k.token_sha256 = $1 AND k.revoked_at IS NULL;

-- name: idempotency_lock
SELECT pg_advisory_xact_lock(hashtextextended($1, 31289));

-- name: idempotency_get
SELECT request_sha256, response_status, response_body
FROM idempotency_keys WHERE tenant_id = $1 AND key = $2;

-- name: idempotency_prune
DELETE FROM idempotency_keys WHERE created_at < now() - make_interval(secs => $1);

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
    INSERT INTO jobs (id, kind, region, tenant_id, resource_type, resource_id, args, max_attempts, trace_context)
    SELECT $10, $11, s.region, s.tenant_id, 'server', s.id, $12, $13, $14 FROM s
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
-- (z9.common.resources) with a table name it validated; the table keeps the lifecycle columns
-- (db/migrations/0004_resource_layer.sql).

-- name: resource_get
SELECT * FROM {table} WHERE id = $1 AND ($2::text IS NULL OR tenant_id = $2);

-- name: resource_list
SELECT * FROM {table}
WHERE tenant_id = $1 AND ($2::text IS NULL OR id > $2) AND ($3::text IS NULL OR status::text = $3)
ORDER BY id
LIMIT $4;

-- name: resource_mark_deleting
-- The deletion buffer starts; status_before_delete says what a cancellation restores.
UPDATE {table}
SET status = 'deleting',
    delete_after = now() + make_interval(secs => $3),
    status_before_delete = status,
    updated_at = now()
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
    updated_at = now()
WHERE id = $1 AND tenant_id = $2 AND status = 'deleting' AND delete_after > now()
RETURNING *;

-- name: resource_reap_expired
WITH due AS (
    SELECT id FROM {table}
    WHERE status = 'deleting' AND delete_after <= now()
    ORDER BY delete_after
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)
UPDATE {table} s
SET status = 'destroying', updated_at = now()
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

-- name: resource_count_live_jobs
-- Live (pending, running, retry) jobs holding a lock on one resource: as their own resource
-- (index-only on jobs_resource_live) or as an extra lock key (jobs_extra_locks_live).
SELECT (SELECT count(*) FROM jobs WHERE resource_id = $1 AND status IN ('pending', 'running', 'retry'))
     + (SELECT count(*) FROM jobs
        WHERE extra_lock_keys @> ARRAY[$1::text] AND cardinality(extra_lock_keys) > 0
          AND status IN ('pending', 'running', 'retry'));

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

-- name: job_insert
INSERT INTO jobs (id, kind, region, tenant_id, resource_type, resource_id, args, max_attempts, trace_context,
                  extra_lock_keys)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
RETURNING *;

-- name: job_insert_notify
-- job_insert and its NOTIFY (delivered at commit) in one statement: one round trip.
WITH ins AS (
    INSERT INTO jobs (id, kind, region, tenant_id, resource_type, resource_id, args, max_attempts, trace_context,
                      extra_lock_keys)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
    RETURNING *
)
SELECT ins.*, pg_notify('z9_jobs', ins.region)::text AS notified FROM ins;

-- name: job_insert_many
-- $10: each job's extra lock keys as a JSON array text (a text[][] would have to be rectangular).
INSERT INTO jobs (id, kind, region, tenant_id, resource_type, resource_id, args, max_attempts, trace_context,
                  extra_lock_keys)
SELECT u.id, u.kind, u.region, u.tenant_id, u.resource_type, u.resource_id, u.args, u.max_attempts,
       u.trace_context, ARRAY(SELECT jsonb_array_elements_text(u.keys::jsonb))
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::jsonb[], $8::int[],
            $9::jsonb[], $10::text[])
     AS u(id, kind, region, tenant_id, resource_type, resource_id, args, max_attempts, trace_context, keys)
RETURNING *;

-- name: jobs_notify
SELECT pg_notify('z9_jobs', r) FROM unnest($1::text[]) AS r;

-- name: job_get
SELECT * FROM jobs WHERE id = $1 AND tenant_id = $2;

-- name: job_get_any
SELECT * FROM jobs WHERE id = $1;

-- name: job_list_for_resource
SELECT * FROM jobs
WHERE tenant_id = $1 AND resource_id = $2 AND ($3::bigint IS NULL OR seq > $3)
ORDER BY seq
LIMIT $4;

-- name: job_list
SELECT * FROM jobs
WHERE tenant_id = $1 AND ($2::bigint IS NULL OR seq > $2)
ORDER BY seq
LIMIT $3;

-- name: job_claim
-- The earliest pending jobs of one region whose lock keys no earlier live job holds (per-resource
-- order, extended to a job's extra_lock_keys), oldest first: `region = $1` (a scalar, not
-- `= ANY(array)`) lets the scan walk jobs_claimable in seq order and stop after $2 rows; with an
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
    WHERE j.status = 'pending' AND j.region = $1 AND j.run_after <= now()
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
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
UPDATE jobs
SET status = 'running',
    attempt = jobs.attempt + 1,
    lease_owner = $3,
    lease_expires_at = now() + make_interval(secs => $4),
    started_at = coalesce(jobs.started_at, now()),
    updated_at = now()
FROM candidates
WHERE jobs.id = candidates.id
RETURNING jobs.*;

-- name: job_heartbeat
UPDATE jobs
SET lease_expires_at = now() + make_interval(secs => $4), updated_at = now()
WHERE id = $1 AND lease_owner = $2 AND attempt = $3 AND status::text = 'running'
RETURNING id;

-- name: job_heartbeat_many
-- Batch renewal: ($1 ids, $2 owners, $3 attempts) fenced row by row; returns the (id, attempt)
-- of the leases still held — a lease missing from the answer is lost.
UPDATE jobs j
SET lease_expires_at = now() + make_interval(secs => $4), updated_at = now()
FROM unnest($1::text[], $2::text[], $3::int[]) AS f(id, owner, attempt)
-- `status::text`: the same test, but it matches no partial index's predicate, so the planner
-- probes the primary key for the ids — stale statistics would otherwise have it scan every live
-- job through jobs_resource_live.
WHERE j.id = ANY($1::text[])
  AND j.id = f.id AND j.lease_owner = f.owner AND j.attempt = f.attempt AND j.status::text = 'running'
RETURNING j.id, j.attempt;

-- name: job_progress
UPDATE jobs
SET steps = $4, lease_expires_at = now() + make_interval(secs => $5), updated_at = now()
WHERE id = $1 AND lease_owner = $2 AND attempt = $3 AND status::text = 'running'
RETURNING id;

-- name: job_remember
UPDATE jobs
SET memo = memo || $4::jsonb, lease_expires_at = now() + make_interval(secs => $5), updated_at = now()
WHERE id = $1 AND lease_owner = $2 AND attempt = $3 AND status::text = 'running'
RETURNING id;

-- name: job_succeed
UPDATE jobs
SET status = 'succeeded', steps = $4, error = NULL, lease_owner = NULL, lease_expires_at = NULL,
    finished_at = now(), updated_at = now()
WHERE id = $1 AND lease_owner = $2 AND attempt = $3 AND status::text = 'running'
RETURNING id;

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
RETURNING j.id, j.attempt;

-- name: job_retry
-- $7 = attempts to give back (1 for a snooze or a hand-over, else 0).
UPDATE jobs
SET status = 'retry', steps = $4, error = $5,
    run_after = now() + make_interval(secs => $6),
    attempt = attempt - $7,
    lease_owner = NULL, lease_expires_at = NULL, updated_at = now()
WHERE id = $1 AND lease_owner = $2 AND attempt = $3 AND status::text = 'running'
RETURNING id, run_after;

-- name: job_fail
UPDATE jobs
SET status = 'failed', steps = $4, error = $5, lease_owner = NULL, lease_expires_at = NULL,
    finished_at = now(), updated_at = now()
WHERE id = $1 AND lease_owner = $2 AND attempt = $3 AND status::text = 'running'
RETURNING id;

-- name: scheduler_notify
SELECT pg_notify('z9_scheduler', '');

-- name: job_retry_due
WITH due AS (
    SELECT id FROM jobs
    WHERE status = 'retry' AND run_after <= now()
    ORDER BY run_after
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)
UPDATE jobs SET status = 'pending', updated_at = now()
FROM due WHERE jobs.id = due.id
RETURNING jobs.id, jobs.region;

-- name: job_retry_next_in
-- Seconds until the earliest retry is due (negative when overdue), NULL when none waits.
SELECT extract(epoch FROM min(run_after) - now())::float8 FROM jobs WHERE status = 'retry';

-- name: lease_reclaim_expired
-- Guarded: FOR UPDATE re-evaluates the CTE's predicate on a row changed since the snapshot,
-- and the outer WHERE repeats it on the locked row (belt and braces), so a job that finished
-- between selection and update is never overwritten.
WITH expired AS (
    SELECT id FROM jobs
    WHERE status = 'running' AND lease_expires_at < now()
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
        'at', now()),
    run_after = now(),
    finished_at = CASE WHEN jobs.attempt >= jobs.max_attempts THEN now() END,
    lease_owner = NULL,
    lease_expires_at = NULL,
    updated_at = now()
FROM expired
WHERE jobs.id = ANY(ARRAY(SELECT id FROM expired))  -- primary-key probes, not a scan of live jobs
  AND jobs.id = expired.id AND jobs.status::text = 'running' AND jobs.lease_expires_at < now()
RETURNING jobs.id, jobs.kind, jobs.status, jobs.region, jobs.attempt, jobs.resource_type, jobs.resource_id,
          jobs.error;

-- name: job_prune_finished
-- Terminal jobs past the retention; nothing outside the job table decides (what a later job needs
-- to know — clone requests — lives in its own table).
DELETE FROM jobs
WHERE id IN (
    SELECT j.id FROM jobs j
    WHERE j.status IN ('succeeded', 'failed') AND j.finished_at < now() - make_interval(secs => $1)
    ORDER BY j.finished_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
);

-- name: job_count_live
-- z9_jobs for the live statuses: an Index Only Scan of jobs_live_counts (status, region, kind).
SELECT kind, region, status::text AS status, count(*) AS n
FROM jobs
WHERE status IN ('pending', 'running', 'retry')
GROUP BY status, region, kind;

-- name: job_count_finished
-- z9_jobs for the finished statuses: an Index Only Scan of jobs_finished_counts; most of the
-- table, so the scheduler runs it less often.
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
SELECT r.region, coalesce(extract(epoch FROM now() - (
    SELECT greatest(j.created_at, j.run_after) FROM jobs j
    WHERE j.status = 'pending' AND j.region = r.region AND j.run_after <= now()
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
