-- z9 schema, version 10: claims do not walk blocked work (issue 14).
--
-- jobs.blocked: a pending job waiting behind an earlier live job that holds one of its lock keys
-- (its resource_id or an extra_lock_keys entry). The claim's index and the oldest-pending
-- metric's index leave blocked jobs out, so 100,000 jobs queued behind 2,000 busy resources cost
-- a claim nothing (before: every claim walked every one of them ahead of the first claimable).
--
-- Kept right by two triggers, in the statement/transaction that changes a job, on every path
-- (API inserts, the executor's finishes, the scheduler's lease reclaim, cancellations, deletes):
-- - jobs_block_on_insert (BEFORE INSERT): a job with a resource is blocked when an earlier live
--   job holds one of its keys;
-- - jobs_unblock_after_end (AFTER UPDATE/DELETE, deferred to commit): when a live job ends, for
--   each of its keys the earliest later live job holding that key is unblocked unless another
--   earlier live job still holds one of its keys (only that job can have been waiting on this one:
--   every later one waits on it in turn), and its region is notified (z9_jobs).
-- Races: an insert takes a shared transaction-level advisory lock on each of its keys, an end an
-- exclusive one at commit, then each decides with a snapshot taken after the lock: an insert never
-- decides on a blocker whose end is committing, and an end sees every job inserted before it.
-- Two ends that both blocked one waiter lock that waiter's row before re-checking it, so the second
-- sees the first's end. Locks are taken in key order / seq order. The claim keeps its own check of
-- earlier live jobs as well (belt and braces): `blocked` only decides what the claim scans.

ALTER TABLE jobs ADD COLUMN blocked boolean NOT NULL DEFAULT false;

-- Whether an earlier live job holds a key of a job on `resource` with extra keys `extra`.
CREATE FUNCTION jobs_key_held(resource text, extra text[], before_seq bigint) RETURNS boolean
LANGUAGE sql STABLE COST 1 AS $$
    SELECT EXISTS (SELECT 1 FROM jobs e
                   WHERE e.resource_id = resource AND e.seq < before_seq
                     AND e.status IN ('pending', 'running', 'retry'))
        OR (cardinality(extra) > 0 AND jobs_lock_held(resource, extra, before_seq))
        OR EXISTS (SELECT 1 FROM jobs e
                   WHERE e.extra_lock_keys && ARRAY[resource] AND e.seq < before_seq
                     AND e.status IN ('pending', 'running', 'retry') AND cardinality(e.extra_lock_keys) > 0)
$$;

CREATE FUNCTION jobs_block_on_insert() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    k text;
BEGIN
    FOR k IN SELECT DISTINCT u FROM unnest(NEW.extra_lock_keys || NEW.resource_id) AS u ORDER BY u LOOP
        PERFORM pg_advisory_xact_lock_shared(hashtextextended('z9-lock-key:' || k, 0));
    END LOOP;
    -- A new statement: its snapshot is taken after the locks (READ COMMITTED).
    SELECT jobs_key_held(NEW.resource_id, NEW.extra_lock_keys, NEW.seq) INTO NEW.blocked;
    RETURN NEW;
END
$$;

CREATE TRIGGER jobs_block_on_insert
    BEFORE INSERT ON jobs
    FOR EACH ROW
    WHEN (NEW.resource_id IS NOT NULL AND NEW.status = 'pending')
    EXECUTE FUNCTION jobs_block_on_insert();

CREATE FUNCTION jobs_unblock_after_end() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    k text;
    keys text[] := OLD.extra_lock_keys || OLD.resource_id;
    waiters text[];
BEGIN
    FOR k IN SELECT DISTINCT u FROM unnest(keys) AS u ORDER BY u LOOP
        PERFORM pg_advisory_xact_lock(hashtextextended('z9-lock-key:' || k, 0));
    END LOOP;
    -- For each key: the earliest later live job holding it (as its resource or an extra key).
    SELECT array_agg(c.id ORDER BY c.seq) INTO waiters
    FROM unnest(keys) AS key
    CROSS JOIN LATERAL (
        (SELECT e.id, e.seq FROM jobs e
         WHERE e.resource_id = key AND e.seq > OLD.seq AND e.status IN ('pending', 'running', 'retry')
         ORDER BY e.seq LIMIT 1)
        UNION ALL
        (SELECT e.id, e.seq FROM jobs e
         WHERE e.extra_lock_keys && ARRAY[key] AND e.seq > OLD.seq
           AND e.status IN ('pending', 'running', 'retry') AND cardinality(e.extra_lock_keys) > 0
         ORDER BY e.seq LIMIT 1)) AS c;
    IF waiters IS NULL THEN
        RETURN NULL;
    END IF;
    -- Lock the blocked ones (seq order), then decide with a snapshot taken after the locks.
    PERFORM 1 FROM jobs WHERE id = ANY(waiters) AND blocked AND status = 'pending' ORDER BY seq FOR UPDATE;
    FOR k IN UPDATE jobs SET blocked = false
             WHERE id = ANY(waiters) AND blocked AND status = 'pending'
               AND NOT jobs_key_held(resource_id, extra_lock_keys, seq)
             RETURNING region LOOP
        PERFORM pg_notify('z9_jobs', k);  -- one per region: NOTIFY folds repeats within a transaction
    END LOOP;
    RETURN NULL;
END
$$;

CREATE CONSTRAINT TRIGGER jobs_unblock_after_end
    AFTER UPDATE OF status ON jobs
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW
    WHEN (OLD.resource_id IS NOT NULL AND OLD.status IN ('pending', 'running', 'retry')
          AND NEW.status IN ('succeeded', 'failed'))
    EXECUTE FUNCTION jobs_unblock_after_end();

CREATE CONSTRAINT TRIGGER jobs_unblock_after_delete
    AFTER DELETE ON jobs
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW
    WHEN (OLD.resource_id IS NOT NULL AND OLD.status IN ('pending', 'running', 'retry'))
    EXECUTE FUNCTION jobs_unblock_after_end();

-- Jobs already waiting.
UPDATE jobs SET blocked = true
WHERE status = 'pending' AND resource_id IS NOT NULL
  AND jobs_key_held(resource_id, extra_lock_keys, seq);

-- The claim and the oldest-pending metric scan only unblocked pending jobs.
DROP INDEX jobs_claimable;
CREATE INDEX jobs_claimable ON jobs (region, seq) WHERE status = 'pending' AND NOT blocked;
DROP INDEX jobs_pending_runnable;
CREATE INDEX jobs_pending_runnable ON jobs (region, run_after)
    INCLUDE (created_at, resource_id, seq, extra_lock_keys) WHERE status = 'pending' AND NOT blocked;
