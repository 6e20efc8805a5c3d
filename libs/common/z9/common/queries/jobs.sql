-- The jobs table: producers (insert), workers (claim, fenced writes), the scheduler, metrics, actions.
-- Writes to a running job are fenced: WHERE id = $1 AND lease_owner = $2 AND attempt = $3
-- AND status = 'running'. Zero rows means the lease is lost. (Written `status::text = 'running'`:
-- the same test, but no partial index's predicate matches it, so the planner always probes the
-- primary key. With `status = 'running'` and statistics taken while no job was live, it chose
-- to scan every live job through jobs_resource_live — see bench/README.md.)
-- Every statement that changes a job's status or steps also runs
-- pg_notify('z9_job_changed', <job id>) (column `notified`): delivered at the commit the change
-- already makes, it wakes the API's long-polls (GET /v1/jobs/{id}?wait_s=) without an extra
-- commit. Heartbeats and memos change neither and notify nothing.

-- name: job_insert
INSERT INTO jobs ({{job_columns}})
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)
RETURNING *;

-- name: job_insert_notify
-- job_insert and its NOTIFY (delivered at commit) in one statement: one round trip.
WITH ins AS (
    INSERT INTO jobs ({{job_columns}})
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)
    RETURNING *
)
SELECT ins.*, pg_notify('z9_jobs', ins.region)::text AS notified FROM ins;

-- name: job_insert_many
-- $10: each job's extra lock keys as a JSON array text (a text[][] would have to be rectangular).
INSERT INTO jobs ({{job_columns}})
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
-- No parameters: {region}, {limit}, {owner}, {lease_ttl_s}, {tenant_cap} (Z9_TENANT_MAX_RUNNING_JOBS,
-- NULL: none) and {now} (NULL: the server's now(); a test clock's time otherwise) are filled in as
-- literals (sql.ql), so PostgreSQL plans this statement once per connection and keeps the plan
-- (force_custom_plan only re-plans statements with parameters), and that plan knows the real LIMIT:
-- a generic plan of a `LIMIT $n` parameter assumes a tenth of the rows and could trade the ordered
-- walks below for a sort of every pending job. Planning was about half of the server's time per job
-- at concurrency 1 (issue 14).
--
-- Fair share by tenant (migration 0022): the tenants with pending jobs in the region (`tenants`: a
-- skip scan of jobs_claimable, one probe per tenant; z9's own jobs are the tenant ''), each one's
-- earliest claimable jobs (`heads`: an ordered walk of its part of jobs_claimable, at most {limit},
-- and at most its room under its cap: jobs_tenant_room), taken round-robin — every tenant's first
-- job, then every tenant's second, ... — the tenants in id order starting after the one this region
-- served last (job_claim_turns: moved to the last tenant served, never waited for). So a tenant's
-- backlog delays another tenant's job by one claim at most.
--
-- Claimable, as before: pending and not `blocked` (migration 0010: jobs waiting behind a live job
-- of one of their keys are not in jobs_claimable at all, so the walk never steps over them), due,
-- and no earlier live job holds one of its lock keys (per-resource order, extended to a job's
-- extra_lock_keys) — the checks below stay as a guard: `region = {region}` (a scalar, not
-- `= ANY(array)`) keeps each walk an index range. The check for an earlier live job of the
-- candidate's resource is a correlated subplan probing jobs_resource_live by resource_id (skipped
-- for jobs without a resource): written as an anti-join, stale statistics (a queue table that
-- looked empty at its last ANALYZE) made the planner scan the whole live index for every
-- candidate. The other keys — a candidate's extra keys, and earlier jobs holding its keys as extra
-- keys — are checked by jobs_lock_held (migration 0004), only for a candidate with extra keys or
-- while any live job has some (one probe of jobs_multikey_live per claim). Jobs wait only for
-- earlier jobs (a total order), so there is no lock cycle. The candidates are locked in the order
-- they are taken (FOR UPDATE SKIP LOCKED, re-checked on the locked row: pending), so concurrent
-- claims never take a job twice and never wait on each other.
-- jobs_finish_and_claim (migration 0022) carries a copy (tests/integration/engine/test_engine_batching.py).
WITH RECURSIVE tenants (k) AS (
    (SELECT coalesce(j.tenant_id, '') FROM jobs j
     WHERE j.status = 'pending' AND NOT j.blocked AND j.region = {region}
     ORDER BY coalesce(j.tenant_id, '')
     LIMIT 1)
    UNION ALL
    SELECT (SELECT coalesce(j.tenant_id, '') FROM jobs j
            WHERE j.status = 'pending' AND NOT j.blocked AND j.region = {region}
              AND coalesce(j.tenant_id, '') > t.k
            ORDER BY coalesce(j.tenant_id, '')
            LIMIT 1)
    FROM tenants t WHERE t.k IS NOT NULL
), turn AS (
    SELECT (SELECT c.tenant_key FROM job_claim_turns c WHERE c.region = {region}) AS last
), heads AS (
    SELECT h.id, h.rn, t.k, coalesce(t.k <= turn.last, false) AS later
    FROM tenants t CROSS JOIN turn CROSS JOIN LATERAL (
        SELECT s.id, row_number() OVER (ORDER BY s.seq) AS rn FROM (
            SELECT j.id, j.seq FROM jobs j
            WHERE coalesce(j.tenant_id, '') = t.k
              AND j.status = 'pending' AND NOT j.blocked AND j.region = {region} AND j.run_after <= coalesce({now}::timestamptz, now())
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
            LIMIT least({limit}, jobs_tenant_room({region}, t.k, {tenant_cap}, {now}::timestamptz))
        ) s
    ) h
    WHERE t.k IS NOT NULL
), candidates AS (
    SELECT j.id, h.rn, h.later, h.k FROM heads h JOIN jobs j ON j.id = h.id
    WHERE j.id = ANY(ARRAY(SELECT id FROM heads))  -- primary-key probes, never a scan of the pending jobs
      AND j.status = 'pending'
    ORDER BY h.rn, h.later, h.k
    LIMIT {limit}
    FOR UPDATE OF j SKIP LOCKED
), taken AS (
    UPDATE jobs
    SET status = 'running',
        attempt = jobs.attempt + 1,
        lease_owner = {owner},
        lease_expires_at = coalesce({now}::timestamptz, now()) + make_interval(secs => {lease_ttl_s}),
        started_at = coalesce(jobs.started_at, {now}::timestamptz, now()),
        updated_at = coalesce({now}::timestamptz, now())
    FROM candidates
    WHERE jobs.id = candidates.id
    RETURNING jobs AS got, jobs.id, jobs.seq
), served AS (
    SELECT c.k FROM candidates c WHERE c.id IN (SELECT id FROM taken)
    ORDER BY c.rn DESC, c.later DESC, c.k DESC
    LIMIT 1
), turn_held AS (
    SELECT m.region FROM job_claim_turns m, served s
    WHERE m.region = {region} AND m.tenant_key <> s.k
    FOR UPDATE OF m SKIP LOCKED
), turn_moved AS (
    UPDATE job_claim_turns m SET tenant_key = s.k FROM served s, turn_held
    WHERE m.region = turn_held.region
), turn_first AS (
    INSERT INTO job_claim_turns (region, tenant_key)
    SELECT {region}, s.k FROM served s, turn
    WHERE CASE WHEN turn.last IS NULL  -- the region's first claim; one inserts, none waits
               THEN pg_try_advisory_xact_lock(hashtextextended('z9-claim-turn:' || {region}, 0)) ELSE false END
    ON CONFLICT (region) DO NOTHING
)
SELECT (t.got).*, pg_notify('z9_job_changed', t.id)::text AS notified FROM taken t ORDER BY t.seq;

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
SET lease_expires_at = coalesce($5::timestamptz, now()) + make_interval(secs => $4), updated_at = coalesce($5::timestamptz, now())
WHERE id = $1 AND lease_owner = $2 AND attempt = $3 AND status::text = 'running'
  AND lease_expires_at > coalesce($5::timestamptz, now())
RETURNING id;

-- name: job_heartbeat_many
-- Batch renewal: ($1 ids, $2 owners, $3 attempts) fenced row by row; returns the (id, attempt,
-- renewed) of the leases still held — a lease missing from the answer is lost; renewed false: held
-- but not extended (the row was locked), its expiry as it was. Never waits on a row lock:
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
    SET lease_expires_at = coalesce($5::timestamptz, now()) + make_interval(secs => $4), updated_at = coalesce($5::timestamptz, now())
    FROM held
    WHERE j.id = ANY(ARRAY(SELECT id FROM held)) AND j.id = held.id
    RETURNING j.id, j.attempt
)
SELECT id, attempt, true AS renewed FROM renewed
UNION ALL
SELECT j.id, j.attempt, false AS renewed FROM jobs j JOIN f ON j.id = f.id
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
FROM jobs_finish_and_claim($1::text[], $2::text[], $3::int[], $4::text[], $5::text, $6::int, $7::text, $8::float8, $9::int) AS f;

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

-- name: job_args_merge
-- Add keys to a job's args before its transaction commits (a server create with a primary
-- address: the address is allocated after the server and its job were inserted).
UPDATE jobs SET args = args || $2::jsonb WHERE id = $1 AND status = 'pending';

-- name: job_get_for_update
SELECT * FROM jobs WHERE id = $1 AND tenant_id = $2 FOR UPDATE;

-- name: job_cancel
-- A job that has not started (pending) or waits between attempts (retry) ends failed with
-- error class `cancelled`; a running job is never touched here (its steps act on the world).
UPDATE jobs
SET status = 'failed', error = $3, finished_at = now(), updated_at = now()
WHERE id = $1 AND tenant_id = $2 AND status IN ('pending', 'retry')
RETURNING *, pg_notify('z9_job_changed', jobs.id)::text AS notified;

-- name: jobs_supersede_waiting
-- In the transaction that enqueues job $2 (an immediate deletion): the resource's jobs of kinds $3
-- enqueued before it that are not running end failed with error $4 (class `cancelled`, naming $2).
UPDATE jobs j
SET status = 'failed', error = $4, finished_at = now(), updated_at = now()
FROM jobs me
WHERE me.id = $2 AND j.resource_id = $1 AND j.seq < me.seq AND j.kind = ANY($3::text[])
  AND j.status IN ('pending', 'retry')
RETURNING j.id, pg_notify('z9_job_changed', j.id)::text AS notified;

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
-- finished ones, newest first: the order of (rank, key), rank 0 retry, 1 pending, 2 running, 3
-- finished, key the job's seq when it is live and -seq when finished. $7, $8: the page starts after
-- the job at (rank, key) $7, $8 (the previous page's last; NULL: the first page).
SELECT * FROM jobs
WHERE ($1::text IS NULL OR region = $1) AND ($2::text IS NULL OR kind = $2)
  AND ($3::text IS NULL OR status::text = $3) AND ($4::text IS NULL OR tenant_id = $4)
  AND NOT (kind = ANY($6::text[]))
  AND ($7::int IS NULL
       OR (CASE status::text WHEN 'retry' THEN 0 WHEN 'pending' THEN 1 WHEN 'running' THEN 2 ELSE 3 END,
           CASE WHEN status::text IN ('retry', 'pending', 'running') THEN seq ELSE -seq END) > ($7::int, $8::bigint))
ORDER BY CASE status::text WHEN 'retry' THEN 0 WHEN 'pending' THEN 1 WHEN 'running' THEN 2 ELSE 3 END,
         CASE WHEN status::text IN ('retry', 'pending', 'running') THEN seq ELSE -seq END
LIMIT $5;

-- name: job_live_counts_by_region
-- The live jobs of every region by status, with the oldest pending one's creation.
SELECT region, status::text AS status, count(*)::int AS n, min(created_at) AS oldest
FROM jobs WHERE status IN ('pending', 'retry', 'running')
GROUP BY region, status;

-- name: job_live_by_tenant
-- Who is waiting: the live jobs of every region by tenant (NULL: z9's own jobs) — pending, running
-- (leases unexpired or not: what the table says), retry — with the tenant's oldest pending job's
-- time runnable (max(created_at, run_after)) and its own cap on running jobs (tenant_quota_limits,
-- unit running_jobs; NULL: the installation's) and how long that job has waited at $1 (NULL: the
-- server's now()), never below 0. For the scheduler's z9_tenant_* metrics and
-- GET /v1/operator/regions. Walks the live jobs once (jobs_resource_live holds no tenant: the rows
-- themselves), bounded by what waits and runs, never by the finished jobs.
SELECT g.region, g.tenant_id, g.pending, g.running, g.retry, g.oldest_runnable, l.quota AS running_cap,
       greatest(coalesce(extract(epoch FROM coalesce($1::timestamptz, now()) - g.oldest_runnable), 0), 0)::float8 AS wait_s
FROM (
    SELECT region, tenant_id,
           count(*) FILTER (WHERE status = 'pending')::int AS pending,
           count(*) FILTER (WHERE status = 'running')::int AS running,
           count(*) FILTER (WHERE status = 'retry')::int AS retry,
           min(greatest(created_at, run_after)) FILTER (WHERE status = 'pending') AS oldest_runnable
    FROM jobs WHERE status IN ('pending', 'running', 'retry')
    GROUP BY region, tenant_id
) g
LEFT JOIN tenant_quota_limits l ON l.tenant_id = g.tenant_id AND l.unit = 'running_jobs'
ORDER BY g.region, g.pending DESC, g.oldest_runnable, g.tenant_id;

-- name: job_list_guard_refusals
-- Jobs the deletion guard refused (the executor marks their error `refused`), newest first.
SELECT * FROM jobs
WHERE status = 'failed' AND (error ->> 'refused') = 'true' AND ($1::text IS NULL OR region = $1)
ORDER BY seq DESC
LIMIT $2;

-- fragment: job_columns
-- The columns a job is inserted with, in order: every statement that inserts jobs names them
-- through this (job_insert, job_insert_notify, job_insert_many, and a type's row-with-its-job
-- statements), so none can lack one.
id, kind, region, tenant_id, resource_type, resource_id, args, max_attempts, trace_context, extra_lock_keys,
actor_token_id, request_id
