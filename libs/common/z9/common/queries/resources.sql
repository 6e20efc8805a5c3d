-- Every resource table's lifecycle (z9.resources.ResourceType): `{table}`/`{status_type}` filled in by the registry.

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
    delete_after = coalesce($4::timestamptz, now()) + make_interval(secs => $3),
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
    status = {{status_if_allowed($2, $3, {status_type})}},
    status_reason = {{reason_cleared_if_allowed($2, $3)}}
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
-- Whether the resource's create ($2: its create kind) failed and no job of the resource ever
-- succeeded: nothing of it was ever in use (its deletion needs no buffer). A volume whose create
-- failed but which a later attach put on a server holds data like any other: any succeeded job
-- keeps the buffer. NULL (false) when no job is kept (pruned): the buffer then applies, as for any
-- resource that may hold data.
SELECT bool_or(kind = $2 AND status = 'failed') AND NOT bool_or(status = 'succeeded')
FROM jobs WHERE resource_id = $1;

-- name: resource_latest_job_args
-- The args of the resource's latest job of kind $2 (NULL: none kept).
SELECT args FROM jobs WHERE resource_id = $1 AND kind = $2 ORDER BY seq DESC LIMIT 1;

-- name: session_name_local
-- The session's application_name until the transaction ends (a read-only plan's: pg_stat_activity).
SELECT set_config('application_name', $1, true);

-- name: resource_live_jobs
-- The live (pending, running, retry) jobs of resource $1 itself, oldest first: id, kind, status.
SELECT id, kind, status::text AS status FROM jobs
WHERE resource_id = $1 AND status IN ('pending', 'running', 'retry') ORDER BY seq;

-- name: resource_count_own_live_jobs
-- Live (pending, running, retry) jobs of resource $1 itself (index-only on jobs_resource_live).
SELECT count(*) FROM jobs WHERE resource_id = $1 AND status IN ('pending', 'running', 'retry');

-- fragment: status_if_allowed(status, allowed, status_type)
-- The rule of every verify's status write (resource_observed, a type's own *_observed): the row
-- moves to <status> only when given and when its current status is one of <allowed> (never over
-- the deletion states, which are not in it); otherwise it keeps its status.
CASE WHEN <status>::text IS NOT NULL AND status::text = ANY(<allowed>::text[])
     THEN <status>::text ELSE status::text END::<status_type>

-- fragment: reason_cleared_if_allowed(status, allowed)
-- The reason goes when status_if_allowed moved the row.
CASE WHEN <status>::text IS NOT NULL AND status::text = ANY(<allowed>::text[]) THEN NULL ELSE status_reason END

-- ---------------------------------------------------------------- drift (the reaper's periodic plan, 0028)

-- name: resource_drift_due
-- Rows of region $1 in a status of $2 with no live job (a job will change them first), whose drift
-- was checked more than $3 seconds before $5 (or now) or never: the stalest first, at most $4.
SELECT r.* FROM {table} r LEFT JOIN resource_drift d ON d.resource_id = r.id
WHERE r.region = $1 AND r.status::text = ANY($2::text[])
  AND (d.checked_at IS NULL OR d.checked_at < coalesce($5::timestamptz, now()) - make_interval(secs => $3))
  AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.resource_id = r.id AND j.status IN ('pending', 'running', 'retry'))
ORDER BY d.checked_at NULLS FIRST, r.id
LIMIT $4;

-- name: resource_drift_record
-- What a plan found for resource $1 (type $2, tenant $3, region $4): in sync ($5), the job kind, drift
-- and steps, at $9 (or now); drifted_since kept while it stays drifted, cleared once in sync.
INSERT INTO resource_drift AS d (resource_id, resource_type, tenant_id, region, in_sync, job_kind, drift, steps,
                                 error, checked_at, drifted_since)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, NULL, coalesce($9::timestamptz, now()),
        CASE WHEN $5 THEN NULL ELSE coalesce($9::timestamptz, now()) END)
ON CONFLICT (resource_id) DO UPDATE SET
    in_sync = EXCLUDED.in_sync, job_kind = EXCLUDED.job_kind, drift = EXCLUDED.drift, steps = EXCLUDED.steps,
    error = NULL, checked_at = EXCLUDED.checked_at,
    drifted_since = CASE WHEN EXCLUDED.in_sync THEN NULL ELSE coalesce(d.drifted_since, EXCLUDED.checked_at) END;

-- name: resource_drift_unknown
-- A plan of resource $1 that could not be made now ($5: why; Proxmox unreachable, a VM locked): checked
-- at $6 (or now), its last known state kept (a first check: in sync until a plan says otherwise).
INSERT INTO resource_drift AS d (resource_id, resource_type, tenant_id, region, in_sync, error, checked_at)
VALUES ($1, $2, $3, $4, true, $5, coalesce($6::timestamptz, now()))
ON CONFLICT (resource_id) DO UPDATE SET error = EXCLUDED.error, checked_at = EXCLUDED.checked_at;

-- name: resource_drift_summary
-- The drifted rows of type $1 still live: how many, and since when the oldest.
SELECT count(*) AS drifted, min(d.drifted_since) AS since
FROM resource_drift d JOIN {table} r ON r.id = d.resource_id
WHERE d.resource_type = $1 AND NOT d.in_sync AND r.status::text NOT IN ('deleting', 'destroying', 'deleted');

-- name: resource_drift_drifted
-- The drifted rows of type $1 still live, drifted longest first, at most $2 (the operator's view).
SELECT d.resource_id, d.resource_type, d.tenant_id, d.region, d.job_kind, d.drift, d.steps, d.checked_at,
       d.drifted_since
FROM resource_drift d JOIN {table} r ON r.id = d.resource_id
WHERE d.resource_type = $1 AND NOT d.in_sync AND r.status::text NOT IN ('deleting', 'destroying', 'deleted')
ORDER BY d.drifted_since, d.resource_id
LIMIT $2;
