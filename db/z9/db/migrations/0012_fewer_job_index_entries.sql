-- z9 schema, version 12: fewer index entries per job (issue 14).
--
-- A job's status changes (pending → running → succeeded) are never HOT updates, so each version of
-- a job row gets an entry in every index whose predicate it matches: 18 entries over a job's life
-- before this migration (7 at insert, 6 at the claim, 5 at the finish) for a job without tenant or
-- resource, 18 for one with both. Each entry is WAL, buffer dirtying and, at concurrency, page
-- contention on the rightmost leaf of every seq- or time-ordered index. Now:
-- - the metric counts of live and of finished jobs (job_count_live / job_count_finished) read
--   columns INCLUDEd in the live-jobs index (jobs_resource_live) and in the pruning index
--   (jobs_finished), which every such version enters anyway: jobs_live_counts and
--   jobs_finished_counts go (each walked the same set of entries the widened index holds);
-- - jobs_resource and jobs_tenant leave out the jobs without a resource / tenant (z9's own jobs):
--   every query reaching them asks for `resource_id = …` / `tenant_id = …`, which no NULL matches.
-- Entries per job: 9 for a job without tenant or resource (W3's no-op jobs), 15 with both.

DROP INDEX jobs_live_counts;
DROP INDEX jobs_finished_counts;

DROP INDEX jobs_resource_live;
CREATE INDEX jobs_resource_live ON jobs (resource_id, seq) INCLUDE (status, region, kind)
    WHERE status IN ('pending', 'running', 'retry');

DROP INDEX jobs_finished;
CREATE INDEX jobs_finished ON jobs (finished_at) INCLUDE (status, region, kind)
    WHERE status IN ('succeeded', 'failed');

DROP INDEX jobs_resource;
CREATE INDEX jobs_resource ON jobs (resource_id, seq) WHERE resource_id IS NOT NULL;

DROP INDEX jobs_tenant;
CREATE INDEX jobs_tenant ON jobs (tenant_id, seq) WHERE tenant_id IS NOT NULL;

-- The executor's finish of jobs whose kinds record nothing, and its next claim, as one statement:
-- one round trip and one commit where the transaction took four round trips (BEGIN, finish,
-- claim, COMMIT). The finish is fenced row by row exactly like job_succeed_many (a row that does
-- not match is reported missing: its lease is lost, and one slot fewer is claimed); the claim is
-- job_claim's, one job at a time (`LIMIT 1`: a literal, so this function's cached generic plan
-- is the ordered walk of jobs_claimable — a generic `LIMIT n` would sort every pending job; the
-- function sets plan_cache_mode for itself, so its plans are built once per connection, not on
-- every call as force_custom_plan would). tests/test_engine_batching.py checks that the claim
-- below says what job_claim in queries.sql says. A finished job with a resource: its waiters are
-- unblocked before the claim (SET CONSTRAINTS … IMMEDIATE, as jobs_unblock_now).
CREATE FUNCTION jobs_finish_and_claim(fin_ids text[], fin_owners text[], fin_attempts int[], fin_steps text[],
                                      claim_region text, claim_limit int, claim_owner text, lease_ttl_s float8)
RETURNS TABLE (finished_id text, finished_attempt int, claimed jobs)
LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    matched int := 0;
    with_resource boolean := false;
    r record;
    got jobs;
    after_seq bigint := 0;
BEGIN
    FOR r IN
        UPDATE jobs
        SET status = 'succeeded', steps = f.steps::jsonb, error = NULL, lease_owner = NULL, lease_expires_at = NULL,
            finished_at = now(), updated_at = now()
        FROM unnest(fin_ids, fin_owners, fin_attempts, fin_steps) AS f(id, owner, attempt, steps)
        WHERE jobs.id = ANY(fin_ids)
          AND jobs.id = f.id AND jobs.lease_owner = f.owner AND jobs.attempt = f.attempt
          AND jobs.status::text = 'running'
        RETURNING jobs.id, jobs.attempt, jobs.resource_id IS NOT NULL AS has_resource,
                  pg_notify('z9_job_changed', jobs.id)::text AS notified
    LOOP
        matched := matched + 1;
        with_resource := with_resource OR r.has_resource;
        finished_id := r.id;
        finished_attempt := r.attempt;
        claimed := NULL;
        RETURN NEXT;
    END LOOP;
    claim_limit := claim_limit - (coalesce(cardinality(fin_ids), 0) - matched);
    IF claim_region IS NULL OR claim_limit <= 0 THEN
        RETURN;
    END IF;
    IF with_resource THEN
        SET CONSTRAINTS jobs_unblock_after_end, jobs_unblock_after_delete IMMEDIATE;
    END IF;
    finished_id := NULL;
    finished_attempt := NULL;
    FOR i IN 1 .. claim_limit LOOP
        -- `j.seq > after_seq`: the next walk starts past the job this loop claimed last (the rows
        -- before it were taken, or not claimable in this statement), so k claims walk k entries.
        WITH candidates AS (
            SELECT j.id FROM jobs j
            WHERE j.seq > after_seq
              AND j.status = 'pending' AND NOT j.blocked AND j.region = claim_region AND j.run_after <= now()
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
            LIMIT 1
            FOR UPDATE SKIP LOCKED
        )
        UPDATE jobs
        SET status = 'running',
            attempt = jobs.attempt + 1,
            lease_owner = claim_owner,
            lease_expires_at = now() + make_interval(secs => lease_ttl_s),
            started_at = coalesce(jobs.started_at, now()),
            updated_at = now()
        FROM candidates
        WHERE jobs.id = candidates.id
        RETURNING jobs.* INTO got;
        EXIT WHEN NOT FOUND;
        after_seq := got.seq;
        PERFORM pg_notify('z9_job_changed', got.id);
        claimed := got;
        RETURN NEXT;
    END LOOP;
END
$$;
