-- z9 schema, version 4: one resource layer (issue 8 §1) — lock keys per job, the clone requests
-- of any resource that owns VMs, and the lifecycle contract every resource table keeps.
--
-- Resources: one table per type (servers; addresses next; load balancers and clusters later),
-- each carrying the same LIFECYCLE COLUMNS with the same meaning:
--     id (text, '<prefix>_' + ULID), tenant_id, region, name, status (an enum holding at least
--     'deleting', 'destroying', 'deleted', 'failed'), status_reason, status_before_delete (same
--     enum), delete_after, observed_at, created_at, updated_at, deleted_at,
--     CHECK (status <> 'deleting' OR delete_after IS NOT NULL),
--     CHECK ((status = 'deleted') = (deleted_at IS NOT NULL)),
--     and the index <table>_deletion_due ON (delete_after) WHERE status = 'deleting'.
-- The lifecycle queries (mark deleting or destroying, cancel deletion, reap expired buffers,
-- mark failed, record observed) are written once in libs/common/z9/common/queries.sql over `{table}`,
-- which the resource-type registry (libs/common/z9/common/resources) fills in with a table name it
-- validated at registration — never with input.
-- Why not one `resources` table with typed side tables: every type keeps its own status enum,
-- CHECKs and partial unique indexes over its typed columns (a live name per tenant, an IP
-- allocated once) on one row, without a trigger or a join to enforce a rule across two tables;
-- and the API's hottest paths (create at >= 1,200 req/s, get, list) read and write one table
-- through one index, as before. What a shared table would give — one place for the lifecycle —
-- the shared columns and the queries written once give as well.
--
-- Lock keys: a job locks its own resource (resource_id) and, in extra_lock_keys, every other
-- resource it touches (an address assignment: the address is its resource, the server and the
-- previous holder its extra keys). A job is claimed only when no earlier (lower seq) live job
-- shares any of its keys. Jobs wait only for earlier jobs — a total order — so there is no
-- cycle and no deadlock: the earliest live job of any set of keys can always run. The single
-- key (almost every job) keeps the B-tree probe of jobs_resource_live; only the rare
-- multi-resource job writes to the two small partial indexes below (jobs_multikey_live: is there
-- any? jobs_extra_locks_live: which hold this key?).
ALTER TABLE jobs ADD COLUMN extra_lock_keys text[] NOT NULL DEFAULT '{}';
ALTER TABLE jobs ADD CONSTRAINT jobs_extra_lock_keys_need_resource
    CHECK (cardinality(extra_lock_keys) = 0 OR resource_id IS NOT NULL);
CREATE INDEX jobs_extra_locks_live ON jobs USING gin (extra_lock_keys)
    WHERE status IN ('pending', 'running', 'retry') AND cardinality(extra_lock_keys) > 0;
CREATE INDEX jobs_multikey_live ON jobs (seq)
    WHERE status IN ('pending', 'running', 'retry') AND cardinality(extra_lock_keys) > 0;

-- Whether an earlier (seq < before_seq) live job holds one of the keys of a job on `resource`
-- with extra keys `extra`: an earlier job of one of its extra keys (jobs_resource_live), or an
-- earlier job holding its resource or an extra key as an extra key of its own
-- (jobs_extra_locks_live). The claim calls it only for a job with extra keys, or while some live
-- job has extra keys (jobs_multikey_live, probed once per claim): a W3-style queue of single-key
-- jobs never pays for it. A function (COST 1) rather than two more sub-selects in the claim: their
-- estimated cost per candidate made the planner trade the ordered walk of jobs_claimable (stopping
-- after LIMIT rows) for a scan and sort of every pending job.
CREATE FUNCTION jobs_lock_held(resource text, extra text[], before_seq bigint) RETURNS boolean
LANGUAGE sql STABLE COST 1 AS $$
    SELECT EXISTS (SELECT 1 FROM jobs e
                   WHERE e.resource_id = ANY(extra) AND e.seq < before_seq
                     AND e.status IN ('pending', 'running', 'retry'))
        OR EXISTS (SELECT 1 FROM jobs e
                   WHERE e.extra_lock_keys && (extra || resource) AND e.seq < before_seq
                     AND e.status IN ('pending', 'running', 'retry') AND cardinality(e.extra_lock_keys) > 0)
$$;
-- z9_job_oldest_pending_age_seconds applies the same rule: its walk stays index-only.
DROP INDEX jobs_pending_runnable;
CREATE INDEX jobs_pending_runnable ON jobs (region, run_after)
    INCLUDE (created_at, resource_id, seq, extra_lock_keys) WHERE status = 'pending';

-- The power state a server had when its deletion began (what a cancellation restores): kept by
-- the table itself, so the lifecycle query that starts a deletion knows no typed column.
CREATE FUNCTION servers_remember_power() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.power_before_delete := OLD.power_state;
    RETURN NEW;
END
$$;

CREATE TRIGGER servers_remember_power
    BEFORE UPDATE OF status ON servers
    FOR EACH ROW
    WHEN (NEW.status = 'deleting' AND OLD.status <> 'deleting')
    EXECUTE FUNCTION servers_remember_power();

-- Clone requests of any resource that owns VMs, keyed by (resource, member): written before the
-- POST (sent_at), answered after (answered_at with the UPID, or the row removed when the
-- hypervisor refused the vmid: nothing was cloned). A request without an answer is uncertain
-- from sent_at — whoever sent it, whether its sender died or lost the answer — since it may
-- still be performed; from lost_at when its sender saw the answer lost (it was in flight until
-- then). They used to live in job memos, which made pruning jobs depend on the
-- resource tables; rows go when their resource is deleted.
CREATE TABLE vm_clone_requests (
    resource_id  text NOT NULL,
    member       text NOT NULL CHECK (member ~ '^[a-z0-9][a-z0-9-]{0,30}$'),
    vmid         integer NOT NULL CHECK (vmid >= 100),
    node         text NOT NULL,
    job_id       text NOT NULL,  -- the job that sent it (no foreign key: jobs are pruned)
    sent_at      timestamptz NOT NULL DEFAULT now(),
    lost_at      timestamptz,  -- its sender saw the answer lost (timeout, dropped): in flight until then
    answered_at  timestamptz,
    upid         text,
    PRIMARY KEY (resource_id, member, vmid),
    CHECK (upid IS NULL OR answered_at IS NOT NULL)
);

-- The clone memos of earlier jobs move here: a memo marked uncertain stays unanswered; the
-- others were answered (their sender recorded no loss).
INSERT INTO vm_clone_requests (resource_id, member, vmid, node, job_id, sent_at, lost_at, answered_at, upid)
SELECT DISTINCT ON (j.resource_id, (c ->> 'vmid')::int)
       j.resource_id, 'main', (c ->> 'vmid')::int, c ->> 'node', j.id,
       coalesce(to_timestamp((c ->> 'uncertain_at')::float8), j.updated_at),
       to_timestamp((c ->> 'uncertain_at')::float8),
       CASE WHEN c ? 'uncertain_at' THEN NULL ELSE j.updated_at END,
       CASE WHEN NOT c ? 'uncertain_at' AND (j.memo -> 'clone' ->> 'vmid')::int = (c ->> 'vmid')::int
            THEN j.memo -> 'clone' ->> 'upid' END
FROM jobs j, jsonb_array_elements(CASE WHEN jsonb_typeof(j.memo -> 'clones') = 'array'
                                       THEN j.memo -> 'clones' ELSE '[]'::jsonb END) AS c
WHERE j.resource_id IS NOT NULL AND c ? 'vmid' AND c ? 'node' AND (c ->> 'vmid')::int >= 100
ORDER BY j.resource_id, (c ->> 'vmid')::int, (c ? 'uncertain_at') DESC, j.seq DESC;
