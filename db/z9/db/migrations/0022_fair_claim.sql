-- z9 schema, version 22: the claim is fair to every tenant.
--
-- Until now a region's pending jobs were claimed strictly oldest first across all tenants: a
-- tenant's backlog of 200 jobs delayed every other tenant's job by the whole backlog. Now the claim
-- (job_claim in libs/common/z9/common/queries/jobs.sql, and its copy in jobs_finish_and_claim below)
-- takes tenants in turn — round-robin from the tenant it served last in the region
-- (job_claim_turns) — and each tenant's jobs oldest first; a tenant may be held to a number of
-- running jobs per region (Z9_TENANT_MAX_RUNNING_JOBS, or its own `running_jobs` row of
-- tenant_quota_limits: jobs_tenant_room). Per-resource order, lock keys, `blocked` and the fenced
-- lease are unchanged. z9's own jobs (no tenant) take their turn as the tenant ''.
--
-- jobs_claimable gains the tenant between region and seq: the claim finds the tenants with
-- pending jobs by a skip scan of it (one probe per tenant), then walks each one's jobs in seq
-- order. Same number of index entries per job as before. (The previous release's claim, serving
-- while this migration runs, still finds a region's pending jobs through it: by region, sorted.)

DROP INDEX jobs_claimable;
CREATE INDEX jobs_claimable ON jobs (region, (coalesce(tenant_id, '')), seq) WHERE status = 'pending' AND NOT blocked;

-- The tenant served last in each region: the next claim starts with the tenant after it (in
-- tenant id order, wrapping). Written by the claim only when the tenant changes, and only when no
-- other claim holds the row (FOR UPDATE SKIP LOCKED: never waits; the first row of a region is
-- inserted by one claim holding an advisory lock, the others skip it), so a queue of one tenant
-- writes nothing here and two executors never wait on each other for it.
CREATE TABLE job_claim_turns (
    region      text PRIMARY KEY,
    tenant_key  text NOT NULL
);

-- How many more jobs of tenant `tenant` (its key: '' for z9's own jobs, never capped) region
-- `claim_region` may start now: NULL when no cap applies (the tenant's `running_jobs` row of
-- tenant_quota_limits, else `default_cap`, Z9_TENANT_MAX_RUNNING_JOBS). A capped tenant is counted
-- under its advisory lock (per region and tenant), held to commit, in a statement of its own
-- (VOLATILE: a fresh snapshot, which sees every claim committed before the lock was had) — so
-- concurrent claims never pass the cap together. Never waits: a lock another claim holds means 0
-- (that claim is taking this tenant's jobs; the next wakeup takes the rest). Running jobs whose
-- lease expired do not count (as the region cap, job_region_running).
CREATE FUNCTION jobs_tenant_room(claim_region text, tenant text, default_cap int, at timestamptz) RETURNS int
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    cap bigint := default_cap;
BEGIN
    IF tenant IS NULL OR tenant = '' THEN
        RETURN NULL;
    END IF;
    SELECT l.quota INTO cap FROM tenant_quota_limits l WHERE l.tenant_id = tenant AND l.unit = 'running_jobs';
    IF NOT FOUND THEN
        cap := default_cap;
    END IF;
    IF cap IS NULL THEN
        RETURN NULL;
    END IF;
    IF NOT pg_try_advisory_xact_lock(hashtextextended('z9-tenant-cap:' || claim_region || ':' || tenant, 0)) THEN
        RETURN 0;
    END IF;
    RETURN greatest(cap - (SELECT count(*) FROM jobs
                           WHERE status = 'running' AND region = claim_region AND tenant_id = tenant
                             AND lease_expires_at > coalesce(at, now())), 0);
END
$$;

-- The one-statement finish and claim (migration 0012) with the fair claim: the claim is job_claim's
-- (tests/integration/engine/test_engine_batching.py checks the copy), for all of the slots at once.
-- `tenant_cap` (Z9_TENANT_MAX_RUNNING_JOBS) defaults to NULL: the previous release's calls, with
-- eight arguments, still resolve while it serves.
DROP FUNCTION jobs_finish_and_claim(text[], text[], int[], text[], text, int, text, float8);
CREATE FUNCTION jobs_finish_and_claim(fin_ids text[], fin_owners text[], fin_attempts int[], fin_steps text[],
                                      claim_region text, claim_limit int, claim_owner text, lease_ttl_s float8,
                                      tenant_cap int DEFAULT NULL)
RETURNS TABLE (finished_id text, finished_attempt int, claimed jobs)
LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    matched int := 0;
    with_resource boolean := false;
    r record;
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
    FOR r IN
        WITH RECURSIVE tenants (k) AS (
            (SELECT coalesce(j.tenant_id, '') FROM jobs j
             WHERE j.status = 'pending' AND NOT j.blocked AND j.region = claim_region
             ORDER BY coalesce(j.tenant_id, '')
             LIMIT 1)
            UNION ALL
            SELECT (SELECT coalesce(j.tenant_id, '') FROM jobs j
                    WHERE j.status = 'pending' AND NOT j.blocked AND j.region = claim_region
                      AND coalesce(j.tenant_id, '') > t.k
                    ORDER BY coalesce(j.tenant_id, '')
                    LIMIT 1)
            FROM tenants t WHERE t.k IS NOT NULL
        ), turn AS (
            SELECT (SELECT c.tenant_key FROM job_claim_turns c WHERE c.region = claim_region) AS last
        ), heads AS (
            SELECT h.id, h.rn, t.k, coalesce(t.k <= turn.last, false) AS later
            FROM tenants t CROSS JOIN turn CROSS JOIN LATERAL (
                SELECT s.id, row_number() OVER (ORDER BY s.seq) AS rn FROM (
                    SELECT j.id, j.seq FROM jobs j
                    WHERE coalesce(j.tenant_id, '') = t.k
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
                    LIMIT least(claim_limit, jobs_tenant_room(claim_region, t.k, tenant_cap, NULL))
                ) s
            ) h
            WHERE t.k IS NOT NULL
        ), candidates AS (
            SELECT j.id, h.rn, h.later, h.k FROM heads h JOIN jobs j ON j.id = h.id
            WHERE j.id = ANY(ARRAY(SELECT id FROM heads))  -- primary-key probes, never a scan of the pending jobs
              AND j.status = 'pending'
            ORDER BY h.rn, h.later, h.k
            LIMIT claim_limit
            FOR UPDATE OF j SKIP LOCKED
        ), taken AS (
            UPDATE jobs
            SET status = 'running',
                attempt = jobs.attempt + 1,
                lease_owner = claim_owner,
                lease_expires_at = now() + make_interval(secs => lease_ttl_s),
                started_at = coalesce(jobs.started_at, now()),
                updated_at = now()
            FROM candidates
            WHERE jobs.id = candidates.id
            RETURNING jobs AS got, jobs.id, jobs.seq
        ), served AS (
            SELECT c.k FROM candidates c WHERE c.id IN (SELECT id FROM taken)
            ORDER BY c.rn DESC, c.later DESC, c.k DESC
            LIMIT 1
        ), turn_held AS (
            SELECT m.region FROM job_claim_turns m, served s
            WHERE m.region = claim_region AND m.tenant_key <> s.k
            FOR UPDATE OF m SKIP LOCKED
        ), turn_moved AS (
            UPDATE job_claim_turns m SET tenant_key = s.k FROM served s, turn_held
            WHERE m.region = turn_held.region
        ), turn_first AS (
            INSERT INTO job_claim_turns (region, tenant_key)
            SELECT claim_region, s.k FROM served s, turn
            WHERE CASE WHEN turn.last IS NULL  -- the region's first claim; one inserts, none waits
                       THEN pg_try_advisory_xact_lock(hashtextextended('z9-claim-turn:' || claim_region, 0)) ELSE false END
            ON CONFLICT (region) DO NOTHING
        )
        SELECT t.got FROM taken t ORDER BY t.seq
    LOOP
        PERFORM pg_notify('z9_job_changed', (r.got).id);
        claimed := r.got;
        RETURN NEXT;
    END LOOP;
END
$$;
