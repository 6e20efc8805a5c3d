-- z9 schema snapshot: the state after every migration in db/z9/db/migrations. Kept equal by tests/integration/database/test_migrations.py.
--
-- Job state machine (architecture §2); the CHECKs and the trigger below enforce it:
--
--   pending ──claim──> running ──plan empty / verify ok──> succeeded
--      ^                  │ temporary error, attempts left ──> retry ──(run_after reached)──> pending
--      │                  │ lease expired (scheduler) ─────────┘
--      │                  └ permanent error, or attempts exhausted ──> failed
--
-- lease_owner/lease_expires_at are set exactly when running; finished_at exactly when terminal;
-- terminal rows are never updated again (trigger); hot queries use partial indexes that exclude
-- terminal rows so their cost does not grow with history.

CREATE TYPE job_status AS ENUM ('pending', 'running', 'retry', 'succeeded', 'failed');

CREATE TYPE server_status AS ENUM (
    'creating', 'running', 'stopped', 'deleting', 'destroying', 'deleted', 'failed'
);

CREATE TABLE tenants (
    id          text PRIMARY KEY CHECK (id ~ '^ten_[0-9a-z]{26}$'),
    name        text NOT NULL UNIQUE CHECK (name ~ '^[a-z0-9][a-z0-9-]{0,62}$'),
    created_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE api_tokens (
    id            text PRIMARY KEY CHECK (id ~ '^tok_[0-9a-z]{26}$'),
    tenant_id     text NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    name          text NOT NULL,
    token_sha256  bytea NOT NULL UNIQUE CHECK (length(token_sha256) = 32),
    created_at    timestamptz NOT NULL DEFAULT now(),
    revoked_at    timestamptz,
    -- migration 0007: read | write | operator (operator only from `z9 token`); coarse last use
    scopes        text[] NOT NULL DEFAULT '{read,write}'
                  CHECK (scopes <@ '{read,write,operator}'::text[] AND cardinality(scopes) >= 1),
    expires_at    timestamptz,
    last_used_at  timestamptz,
    created_by    text
);

CREATE INDEX api_tokens_tenant ON api_tokens (tenant_id, id);

-- Resources: one table per type (servers; addresses next; load balancers and clusters later),
-- each carrying the same LIFECYCLE COLUMNS with the same meaning:
--     id (text, '<prefix>_' + ULID), tenant_id, region, name, status (an enum holding at least
--     'deleting', 'destroying', 'deleted', 'failed'), status_reason, status_before_delete (same
--     enum), delete_after, observed_at, created_at, updated_at, deleted_at,
--     labels (jsonb object, NOT NULL DEFAULT '{}': migration 0011; the generic list filters on it),
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
--
-- servers keeps them; its power_before_delete is set by a trigger (below).
CREATE TABLE servers (
    id                   text PRIMARY KEY CHECK (id ~ '^srv_[0-9a-z]{26}$'),
    tenant_id            text NOT NULL REFERENCES tenants (id),
    region               text NOT NULL,
    name                 text NOT NULL,
    image                text NOT NULL,
    cores                integer NOT NULL CHECK (cores BETWEEN 1 AND 128),
    memory_mib           integer NOT NULL CHECK (memory_mib BETWEEN 128 AND 4194304),
    disk_gib             integer NOT NULL CHECK (disk_gib BETWEEN 1 AND 65536),
    ssh_keys             text[] NOT NULL DEFAULT '{}',
    status               server_status NOT NULL DEFAULT 'creating',
    status_reason        text,
    vmid                 integer CHECK (vmid >= 100),
    node                 text,
    power_state          text CHECK (power_state IN ('running', 'stopped')),
    status_before_delete server_status,
    power_before_delete  text CHECK (power_before_delete IN ('running', 'stopped')),
    delete_after         timestamptz,
    observed_at          timestamptz,
    created_at           timestamptz NOT NULL DEFAULT now(),
    updated_at           timestamptz NOT NULL DEFAULT now(),
    deleted_at           timestamptz,
    labels               jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(labels) = 'object'),  -- 0011
    CHECK (status <> 'deleting' OR delete_after IS NOT NULL),
    CHECK ((status = 'deleted') = (deleted_at IS NOT NULL)),
    CHECK ((vmid IS NULL) = (node IS NULL))
);

CREATE UNIQUE INDEX servers_tenant_name_live ON servers (tenant_id, name) WHERE status <> 'deleted';
CREATE INDEX servers_tenant_id ON servers (tenant_id, id);
CREATE INDEX servers_deletion_due ON servers (delete_after) WHERE status = 'deleting';

-- The power state a server had when its deletion began (what a cancellation restores).
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


-- (migration 0014) The jobs table's one-column checks are domains: checked when a value is
-- assigned, not on every UPDATE of the row (see the migration).
CREATE DOMAIN job_attempt AS integer CONSTRAINT jobs_attempt_check CHECK (VALUE >= 0);
CREATE DOMAIN job_max_attempts AS integer CONSTRAINT jobs_max_attempts_check CHECK (VALUE >= 1);
CREATE DOMAIN job_steps AS jsonb CONSTRAINT jobs_steps_check CHECK (jsonb_typeof(VALUE) = 'array');
CREATE DOMAIN job_memo AS jsonb CONSTRAINT jobs_memo_check CHECK (jsonb_typeof(VALUE) = 'object');
CREATE DOMAIN job_error AS jsonb CONSTRAINT jobs_error_check CHECK (VALUE IS NULL OR (VALUE ? 'class' AND VALUE ? 'message'));
CREATE DOMAIN job_request_id AS text CONSTRAINT jobs_request_id_check CHECK (length(VALUE) <= 200);

CREATE TABLE jobs (
    id                text PRIMARY KEY CHECK (id ~ '^job_[0-9a-z]{26}$'),
    seq               bigint GENERATED ALWAYS AS IDENTITY,
    kind              text NOT NULL,
    region            text NOT NULL,
    tenant_id         text REFERENCES tenants (id),
    resource_type     text,
    resource_id       text,
    args              jsonb NOT NULL DEFAULT '{}',
    status            job_status NOT NULL DEFAULT 'pending',
    attempt           job_attempt NOT NULL DEFAULT 0,
    max_attempts      job_max_attempts NOT NULL DEFAULT 10,
    run_after         timestamptz NOT NULL DEFAULT now(),
    lease_owner       text,
    lease_expires_at  timestamptz,
    steps             job_steps NOT NULL DEFAULT '[]',
    memo              job_memo NOT NULL DEFAULT '{}',
    error             job_error,
    trace_context     jsonb,
    created_at        timestamptz NOT NULL DEFAULT now(),
    started_at        timestamptz,
    finished_at       timestamptz,
    updated_at        timestamptz NOT NULL DEFAULT now(),
    -- Resources locked besides resource_id (migration 0004): claimed only when no earlier live
    -- job shares any key.
    extra_lock_keys   text[] NOT NULL DEFAULT '{}',
    -- migration 0007: the API token that asked for the job (NULL: z9 itself) and its request id
    actor_token_id    text,
    request_id        job_request_id,
    -- migration 0010: pending behind an earlier live job holding one of its lock keys (kept by
    -- the triggers jobs_block_on_insert / jobs_unblock_after_end); the claim does not scan it
    blocked           boolean NOT NULL DEFAULT false,
    CHECK ((resource_type IS NULL) = (resource_id IS NULL)),
    CHECK ((lease_owner IS NULL) = (lease_expires_at IS NULL)),
    CHECK ((status = 'running') = (lease_owner IS NOT NULL)),
    CHECK ((status IN ('succeeded', 'failed')) = (finished_at IS NOT NULL)),
    CHECK (status <> 'failed' OR error IS NOT NULL),
    CONSTRAINT jobs_extra_lock_keys_need_resource CHECK (cardinality(extra_lock_keys) = 0 OR resource_id IS NOT NULL)
);

-- Claim: pending jobs of a region by tenant, each tenant's in submission order (migration 0022;
-- seq has no index of its own, see migrations/0003_claim_index.sql).
CREATE INDEX jobs_claimable ON jobs (region, (coalesce(tenant_id, '')), seq) WHERE status = 'pending' AND NOT blocked;
-- Per-resource order: the earliest live job of a resource. Also the z9_jobs counts of live jobs,
-- index-only (migration 0012: the INCLUDEd columns replace jobs_live_counts).
CREATE INDEX jobs_resource_live ON jobs (resource_id, seq) INCLUDE (status, region, kind)
    WHERE status IN ('pending', 'running', 'retry');
-- Scheduler: due retries and expired leases.
CREATE INDEX jobs_retry_due ON jobs (run_after) WHERE status = 'retry';
CREATE INDEX jobs_lease_expiry ON jobs (lease_expires_at) WHERE status = 'running';
-- Pruning finished jobs; the z9_jobs counts of finished jobs, index-only (migration 0012: the
-- INCLUDEd columns replace jobs_finished_counts).
CREATE INDEX jobs_finished ON jobs (finished_at) INCLUDE (status, region, kind)
    WHERE status IN ('succeeded', 'failed');
-- Listing the jobs of a resource / tenant (migration 0012: z9's own jobs, without one, left out).
CREATE INDEX jobs_resource ON jobs (resource_id, seq) WHERE resource_id IS NOT NULL;
CREATE INDEX jobs_tenant ON jobs (tenant_id, seq) WHERE tenant_id IS NOT NULL;
-- Metrics (migration 0002): the oldest runnable pending job per region.
CREATE INDEX jobs_pending_runnable ON jobs (region, run_after)
    INCLUDE (created_at, resource_id, seq, extra_lock_keys) WHERE status = 'pending' AND NOT blocked;
-- Lock keys (migration 0004): live jobs that lock resources besides their own.
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

-- Blocked jobs (migration 0010, which explains the locking).
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

-- (migration 0013) Key locks exclusive and seq drawn after them: per key, seq order is commit order.
CREATE FUNCTION jobs_block_on_insert() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    k text;
BEGIN
    -- Exclusive, to commit: two transactions enqueuing jobs of one key take their turns.
    FOR k IN SELECT DISTINCT u FROM unnest(NEW.extra_lock_keys || NEW.resource_id) AS u ORDER BY u LOOP
        PERFORM pg_advisory_xact_lock(hashtextextended('z9-lock-key:' || k, 0));
    END LOOP;
    -- The job's place in line is taken now, holding its keys (the column default's value was
    -- drawn before): per key, seq order is commit order.
    NEW.seq := nextval(pg_get_serial_sequence('jobs', 'seq'));
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

-- (migration 0022) Fair share by tenant: the claim's turn per region, a tenant's room under its cap.
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

-- (migrations 0012, 0022) The executor's finish of jobs whose kinds record nothing, and its next
-- claim, as one statement: one round trip and one commit where the transaction took four (BEGIN,
-- finish, claim, COMMIT). The finish is fenced row by row like job_succeed_many; the claim is a copy
-- of job_claim (tests/integration/engine/test_engine_batching.py checks it).
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

CREATE FUNCTION jobs_terminal_immutable() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'job % is %: terminal jobs are never changed', OLD.id, OLD.status
        USING ERRCODE = 'check_violation';
END
$$;

CREATE TRIGGER jobs_terminal_immutable
    BEFORE UPDATE ON jobs
    FOR EACH ROW
    WHEN (OLD.status IN ('succeeded', 'failed'))
    EXECUTE FUNCTION jobs_terminal_immutable();

CREATE TABLE idempotency_keys (
    tenant_id       text NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    key             text NOT NULL CHECK (length(key) BETWEEN 1 AND 255),
    request_sha256  bytea NOT NULL,
    response_status integer NOT NULL,
    response_body   jsonb NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, key)
);

-- Clone requests of any resource that owns VMs (migration 0004): written before the POST,
-- answered after; unanswered = uncertain since sent_at. Rows go when their resource is deleted.
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

-- Address pools and addresses (migration 0005): the design is described in db/z9/db/migrations/0005_addresses.sql.
CREATE EXTENSION IF NOT EXISTS btree_gist;

CREATE TABLE address_pools (
    id            text PRIMARY KEY CHECK (id ~ '^apl_[0-9a-z]{26}$'),
    region        text NOT NULL,
    name          text NOT NULL CHECK (name ~ '^[a-z0-9][a-z0-9-]{0,62}$'),
    family        smallint NOT NULL CHECK (family IN (4, 6)),
    cidr          cidr NOT NULL,
    gateway       inet,
    first_ip      inet NOT NULL,
    last_ip       inet NOT NULL,
    reserved      inet[] NOT NULL DEFAULT '{}',
    bridge        text NOT NULL,
    vlan          integer CHECK (vlan BETWEEN 1 AND 4094),
    nameservers   inet[] NOT NULL DEFAULT '{}',
    quarantine_s  integer NOT NULL DEFAULT 3600 CHECK (quarantine_s >= 0),
    disabled_at   timestamptz,
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    UNIQUE (region, name),
    CHECK (family(cidr) = family AND family(first_ip) = family AND family(last_ip) = family),
    CHECK (first_ip << cidr AND last_ip << cidr AND first_ip <= last_ip),
    CHECK (masklen(first_ip) = CASE family WHEN 4 THEN 32 ELSE 128 END
           AND masklen(last_ip) = masklen(first_ip)
           AND (gateway IS NULL OR masklen(gateway) = masklen(first_ip))),
    CHECK (last_ip - first_ip < 65536),
    CHECK (gateway IS NULL OR (gateway << cidr AND family(gateway) = family)),
    CONSTRAINT address_pools_no_overlap
        EXCLUDE USING gist (region WITH =, cidr inet_ops WITH &&) WHERE (disabled_at IS NULL)
);

CREATE TYPE address_status AS ENUM ('creating', 'active', 'deleting', 'destroying', 'deleted', 'failed');

CREATE TABLE addresses (
    id                    text PRIMARY KEY CHECK (id ~ '^adr_[0-9a-z]{26}$'),
    tenant_id             text NOT NULL REFERENCES tenants (id),
    region                text NOT NULL,
    pool_id               text NOT NULL REFERENCES address_pools (id),
    pool_name             text NOT NULL,      -- the pool's name, prefix and gateway, copied at
    prefix                smallint NOT NULL,  -- allocation: the address's network for its life
    gateway               inet,
    ip                    inet NOT NULL,
    family                smallint NOT NULL CHECK (family IN (4, 6)),
    kind                  text NOT NULL CHECK (kind IN ('primary', 'floating')),
    name                  text CHECK (name ~ '^[a-z0-9][a-z0-9-]{0,62}$'),
    dns_ptr               text CHECK (length(dns_ptr) BETWEEN 1 AND 253),
    protect_delete        boolean NOT NULL DEFAULT false,
    auto_delete           boolean NOT NULL DEFAULT false,
    -- deferred: a server's primary address is allocated before the server row is written, in
    -- the one transaction that inserts both and their jobs
    server_id             text REFERENCES servers (id) DEFERRABLE INITIALLY DEFERRED,
    status                address_status NOT NULL DEFAULT 'creating',
    status_reason         text,
    status_before_delete  address_status,
    server_before_delete  text REFERENCES servers (id),
    delete_after          timestamptz,
    observed              jsonb,
    observed_at           timestamptz,
    created_at            timestamptz NOT NULL DEFAULT now(),
    updated_at            timestamptz NOT NULL DEFAULT now(),
    deleted_at            timestamptz,
    labels                jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(labels) = 'object'),  -- 0011
    CHECK (family(ip) = family AND masklen(ip) = CASE family WHEN 4 THEN 32 ELSE 128 END),
    CHECK (status <> 'deleting' OR delete_after IS NOT NULL),
    CHECK ((status = 'deleted') = (deleted_at IS NOT NULL)),
    CHECK (status <> 'deleted' OR server_id IS NULL),
    CHECK (prefix BETWEEN 0 AND CASE family WHEN 4 THEN 32 ELSE 128 END)
);

-- The last line of "never given twice": two live addresses of a region never share an IP.
CREATE UNIQUE INDEX addresses_ip_live ON addresses (region, ip) WHERE status <> 'deleted';
-- At most one live primary address per family per server (Hetzner's server_has_ipv4/ipv6).
CREATE UNIQUE INDEX addresses_primary_per_server ON addresses (server_id, family)
    WHERE kind = 'primary' AND status <> 'deleted';
CREATE UNIQUE INDEX addresses_tenant_name_live ON addresses (tenant_id, name)
    WHERE status <> 'deleted' AND name IS NOT NULL;
CREATE INDEX addresses_tenant_id ON addresses (tenant_id, id);
CREATE INDEX addresses_server ON addresses (server_id) WHERE server_id IS NOT NULL;
CREATE INDEX addresses_deletion_due ON addresses (delete_after) WHERE status = 'deleting';

-- The lifecycle queries are written once for every resource table (migration 0004); what a
-- deletion means for an address the table keeps itself: a protected address is not deleted
-- (the API answers 409 protected), nor a server's primary (409 must_be_unassigned: its VM's
-- cloud-init still names it); a deletion takes the address off its server (its buffer's
-- AddressUnassign makes that true in the world) and remembers the server, which a cancellation
-- gives back (the restoring AddressAssign then puts it on again).
CREATE FUNCTION addresses_deletion() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status IN ('deleting', 'destroying') AND OLD.status NOT IN ('deleting', 'destroying') THEN
        IF OLD.protect_delete THEN
            RAISE EXCEPTION 'address % is protected against deletion; turn protection.delete off first', OLD.id
                USING ERRCODE = 'check_violation', CONSTRAINT = 'addresses_protected';
        END IF;
        IF OLD.kind = 'primary' AND OLD.server_id IS NOT NULL AND NEW.status = 'deleting' THEN
            RAISE EXCEPTION 'address % is the primary address of server %; unassign it first (with the server '
                            'stopped), or delete the server', OLD.id, OLD.server_id
                USING ERRCODE = 'check_violation', CONSTRAINT = 'addresses_must_be_unassigned';
        END IF;
        NEW.server_before_delete := OLD.server_id;
        NEW.server_id := NULL;
    ELSIF OLD.status = 'deleting' AND NEW.status NOT IN ('deleting', 'destroying', 'deleted') THEN
        -- back on its server, unless that server has gone meanwhile
        NEW.server_id := (SELECT s.id FROM servers s WHERE s.id = OLD.server_before_delete
                          AND s.status NOT IN ('destroying', 'deleted'));
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER addresses_deletion
    BEFORE UPDATE OF status ON addresses
    FOR EACH ROW
    WHEN (NEW.status IS DISTINCT FROM OLD.status)
    EXECUTE FUNCTION addresses_deletion();

-- A server shows its primary IPv4 address (GET /v1/servers): kept on the server row by the
-- addresses table itself, in the transaction that changes the address, so every server query
-- (the generic lifecycle ones included) returns it without a join.
ALTER TABLE servers ADD COLUMN primary_ipv4_id text, ADD COLUMN primary_ipv4 inet;

CREATE FUNCTION addresses_server_primary() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    sid text;
BEGIN
    FOREACH sid IN ARRAY ARRAY[CASE WHEN TG_OP = 'UPDATE' THEN OLD.server_id END, NEW.server_id] LOOP
        IF sid IS NOT NULL THEN
            -- (at most one: addresses_primary_per_server)
            UPDATE servers s
            SET primary_ipv4_id = (SELECT a.id FROM addresses a WHERE a.server_id = sid AND a.kind = 'primary'
                                   AND a.family = 4 AND a.status <> 'deleted'),
                primary_ipv4 = (SELECT a.ip FROM addresses a WHERE a.server_id = sid AND a.kind = 'primary'
                                AND a.family = 4 AND a.status <> 'deleted')
            WHERE s.id = sid;
        END IF;
    END LOOP;
    RETURN NULL;
END
$$;

CREATE TRIGGER addresses_server_primary_insert
    AFTER INSERT ON addresses
    FOR EACH ROW
    WHEN (NEW.kind = 'primary' AND NEW.server_id IS NOT NULL)
    EXECUTE FUNCTION addresses_server_primary();

CREATE TRIGGER addresses_server_primary_update
    AFTER UPDATE OF server_id, status, kind ON addresses
    FOR EACH ROW
    WHEN ((NEW.kind = 'primary' OR OLD.kind = 'primary')
          AND (NEW.server_id IS DISTINCT FROM OLD.server_id OR NEW.status IS DISTINCT FROM OLD.status
               OR NEW.kind IS DISTINCT FROM OLD.kind))
    EXECUTE FUNCTION addresses_server_primary();

CREATE TABLE address_pool_ips (
    pool_id         text NOT NULL REFERENCES address_pools (id),
    ip              inet NOT NULL,
    address_id      text REFERENCES addresses (id),
    reusable_after  timestamptz,
    PRIMARY KEY (pool_id, ip),
    CHECK (address_id IS NULL OR reusable_after IS NULL)
);
-- The allocator's path: a pool's free rows in IP order (quarantined rows included, filtered).
CREATE INDEX address_pool_ips_free ON address_pool_ips (pool_id, ip) INCLUDE (reusable_after)
    WHERE address_id IS NULL;
CREATE UNIQUE INDEX address_pool_ips_holder ON address_pool_ips (address_id) WHERE address_id IS NOT NULL;

-- Per-tenant overrides of the Z9_QUOTA_* defaults (NULL: the default), set by `z9 quota`; see
-- db/z9/db/migrations/0011_labels_and_quotas.sql.
CREATE TABLE tenant_quotas (
    tenant_id   text PRIMARY KEY REFERENCES tenants (id),
    servers     integer CHECK (servers >= 0),
    cores       integer CHECK (cores >= 0),
    memory_mib  bigint CHECK (memory_mib >= 0),
    addresses   integer CHECK (addresses >= 0),
    updated_at  timestamptz NOT NULL DEFAULT now()
);
-- migration 0008: load balancers (see db/z9/db/migrations/0008_load_balancers.sql for the design notes)
CREATE TYPE load_balancer_status AS ENUM ('creating', 'active', 'deleting', 'destroying', 'deleted', 'failed');

CREATE TABLE load_balancers (
    id                    text PRIMARY KEY CHECK (id ~ '^lb_[0-9a-z]{26}$'),
    tenant_id             text NOT NULL REFERENCES tenants (id),
    region                text NOT NULL,
    name                  text NOT NULL CHECK (name ~ '^[a-z0-9][a-z0-9-]{0,62}$'),
    type                  text NOT NULL CHECK (type IN ('lb-small', 'lb-ha')),
    algorithm             text NOT NULL CHECK (algorithm IN ('round_robin', 'least_connections')),
    services              jsonb NOT NULL DEFAULT '[]',  -- [{protocol, listen_port, ..., health_check}]
    targets               jsonb NOT NULL DEFAULT '[]',  -- [{type: server, server_id} | {type: ip, ip}]
    addresses             jsonb NOT NULL DEFAULT '{}',  -- {vip|lb-0|lb-1: {id, ip, prefix, gateway}}: fixed at create
    config_hash           text,                 -- sha256 of the rendered HAProxy config (desired)
    config_version        bigint NOT NULL DEFAULT 1,  -- +1 with every change of services/targets/algorithm
    status                load_balancer_status NOT NULL DEFAULT 'creating',
    status_reason         text,
    status_before_delete  load_balancer_status,
    delete_after          timestamptz,
    labels                jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(labels) = 'object'),  -- 0011
    health                text NOT NULL DEFAULT 'unknown'
                          CHECK (health IN ('healthy', 'degraded', 'unhealthy', 'unknown')),
    health_detail         jsonb,                -- {targets: {key: [{listen_port, status, reason}]}}
    health_at             timestamptz,
    observed              jsonb,                -- members (vmid, node, running, config hash, holds VIP)
    observed_at           timestamptz,
    created_at            timestamptz NOT NULL DEFAULT now(),
    updated_at            timestamptz NOT NULL DEFAULT now(),
    deleted_at            timestamptz,
    CHECK (status <> 'deleting' OR delete_after IS NOT NULL),
    CHECK ((status = 'deleted') = (deleted_at IS NOT NULL))
);
CREATE UNIQUE INDEX load_balancers_tenant_name_live ON load_balancers (tenant_id, name) WHERE status <> 'deleted';
CREATE INDEX load_balancers_tenant_id ON load_balancers (tenant_id, id);
-- every live load balancer targeting a server (its final delete reconfigures them):
-- targets @> '[{"server_id": "srv_…"}]'
CREATE INDEX load_balancers_targets ON load_balancers USING gin (targets jsonb_path_ops) WHERE status <> 'deleted';
CREATE INDEX load_balancers_deletion_due ON load_balancers (delete_after) WHERE status = 'deleting';
-- the periodic health refresh's scan (live load balancers, stalest first)
CREATE INDEX load_balancers_observe_due ON load_balancers (observed_at NULLS FIRST)
    WHERE status IN ('active', 'failed');

ALTER TABLE addresses DROP CONSTRAINT addresses_kind_check;
ALTER TABLE addresses
    ADD CONSTRAINT addresses_kind_check CHECK (kind IN ('primary', 'floating', 'load_balancer')),
    ADD COLUMN load_balancer_id text REFERENCES load_balancers (id) DEFERRABLE INITIALLY DEFERRED,
    ADD COLUMN lb_member text CHECK (lb_member ~ '^lb-[0-9]$'),
    ADD CONSTRAINT addresses_load_balancer_owned
        CHECK ((kind = 'load_balancer') = (load_balancer_id IS NOT NULL)
               AND (lb_member IS NULL OR kind = 'load_balancer')
               AND (kind <> 'load_balancer' OR server_id IS NULL));
CREATE UNIQUE INDEX addresses_load_balancer_member ON addresses (load_balancer_id, coalesce(lb_member, 'vip'))
    WHERE load_balancer_id IS NOT NULL AND status <> 'deleted';

-- A load balancer's addresses live and die with it: never deleted or assigned on their own
-- (the API answers 409 load_balancer_address). Only its final delete marks them deleted, in the
-- statement that releases them (straight to 'deleted', which this rule lets through).
CREATE FUNCTION addresses_load_balancer_rule() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.load_balancer_id IS NOT NULL
       AND (NEW.status IN ('deleting', 'destroying') OR NEW.server_id IS NOT NULL) THEN
        RAISE EXCEPTION 'address % belongs to load balancer %; it goes when the load balancer is deleted',
            OLD.id, OLD.load_balancer_id
            USING ERRCODE = 'check_violation', CONSTRAINT = 'addresses_load_balancer_address';
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER addresses_load_balancer_rule
    BEFORE UPDATE OF status, server_id ON addresses
    FOR EACH ROW
    WHEN (OLD.load_balancer_id IS NOT NULL)
    EXECUTE FUNCTION addresses_load_balancer_rule();

-- z9 schema, version 9: Kubernetes clusters (issue 11).
--
-- A cluster is one resource (k8s_…) owning N VMs (its members: cp-0…, <pool>-0…) and one address
-- (its control-plane endpoint, allocated in the API transaction, protected from deletion through
-- /v1/addresses and released by the cluster's delete). Deletion is immediate: DELETE moves it to
-- 'destroying' and enqueues ClusterDelete at once (no buffer, no cancel).
--
-- The desired shape (control_plane, node_pools) is what the API accepted; members is what the
-- last converge or observe saw ([{name, role, pool, vmid, node, address, power_state, ready}]).
-- initialized_at: the first time every desired member was a Ready node (kubeconfigs are minted
-- only from then on: 409 cluster_not_ready before).
--
-- cluster_keys holds the cluster's PKI (CA, etcd CA, front-proxy CA, service-account key pair),
-- encrypted with the installation key (AES-256-GCM, the cluster id as associated data). The
-- delete removes the row in the transaction that marks the cluster deleted; nothing else reads
-- keys back from a VM.

CREATE TYPE cluster_status AS ENUM ('creating', 'running', 'degraded', 'updating', 'deleting', 'destroying',
                                    'deleted', 'failed');

CREATE TABLE clusters (
    id                    text PRIMARY KEY CHECK (id ~ '^k8s_[0-9a-z]{26}$'),
    tenant_id             text NOT NULL REFERENCES tenants (id),
    region                text NOT NULL,
    name                  text NOT NULL CHECK (name ~ '^[a-z0-9][a-z0-9-]{0,62}$'),
    version               text NOT NULL,
    image                 text NOT NULL,
    control_plane         jsonb NOT NULL,
    node_pools            jsonb NOT NULL,
    endpoint_address_id   text REFERENCES addresses (id),
    endpoint_ip           inet,
    members               jsonb NOT NULL DEFAULT '[]',
    initialized_at        timestamptz,
    status                cluster_status NOT NULL DEFAULT 'creating',
    status_reason         text,
    status_before_delete  cluster_status,
    delete_after          timestamptz,
    labels                jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(labels) = 'object'),  -- 0011
    observed_at           timestamptz,
    created_at            timestamptz NOT NULL DEFAULT now(),
    updated_at            timestamptz NOT NULL DEFAULT now(),
    deleted_at            timestamptz,
    CHECK (status <> 'deleting' OR delete_after IS NOT NULL),
    CHECK ((status = 'deleted') = (deleted_at IS NOT NULL))
);
CREATE UNIQUE INDEX clusters_tenant_name_live ON clusters (tenant_id, name) WHERE status <> 'deleted';
CREATE INDEX clusters_deletion_due ON clusters (delete_after) WHERE status = 'deleting';

CREATE TABLE cluster_keys (
    cluster_id  text PRIMARY KEY REFERENCES clusters (id),
    key_id      text NOT NULL,       -- which installation key sealed it (sha256 prefix)
    nonce       bytea NOT NULL CHECK (length(nonce) = 12),
    sealed      bytea NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- A live cluster's endpoint address is neither deleted nor assigned to a server through /v1/addresses,
-- protection or not (the API answers 409 cluster_endpoint): the cluster's delete releases it.
CREATE FUNCTION addresses_cluster_endpoint() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF ((NEW.status IN ('deleting', 'destroying') AND OLD.status NOT IN ('deleting', 'destroying'))
        OR (NEW.server_id IS NOT NULL AND NEW.server_id IS DISTINCT FROM OLD.server_id))
       AND EXISTS (SELECT 1 FROM clusters c WHERE c.endpoint_address_id = OLD.id AND c.status <> 'deleted') THEN
        RAISE EXCEPTION 'address % is the control-plane endpoint of a Kubernetes cluster: it is neither assigned '
                        'to a server nor deleted on its own (delete the cluster instead)', OLD.id
            USING ERRCODE = 'check_violation', CONSTRAINT = 'addresses_cluster_endpoint';
    END IF;
    RETURN NEW;
END;
$$;
CREATE TRIGGER addresses_cluster_endpoint
    BEFORE UPDATE OF status, server_id ON addresses
    FOR EACH ROW
    EXECUTE FUNCTION addresses_cluster_endpoint();

-- migration 0015: quarantine by address, token lineage, kubeconfig records (see db/z9/db/migrations/0015_tenant_walls.sql)
CREATE TABLE address_quarantine (
    region          text NOT NULL,
    ip              inet NOT NULL,
    reusable_after  timestamptz NOT NULL,
    PRIMARY KEY (region, ip)
);

-- a release (reusable_after set on a row) is remembered by (region, ip); a later write of the
-- row's quarantine (an operator shortening it by hand, a test) is the one remembered
CREATE FUNCTION address_pool_ips_quarantine_remember() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO address_quarantine (region, ip, reusable_after)
    SELECT p.region, NEW.ip, NEW.reusable_after FROM address_pools p WHERE p.id = NEW.pool_id
    ON CONFLICT (region, ip) DO UPDATE SET reusable_after = EXCLUDED.reusable_after;
    RETURN NULL;
END
$$;

CREATE TRIGGER address_pool_ips_quarantine_remember
    AFTER UPDATE OF reusable_after ON address_pool_ips
    FOR EACH ROW
    WHEN (NEW.reusable_after IS NOT NULL AND NEW.reusable_after IS DISTINCT FROM OLD.reusable_after)
    EXECUTE FUNCTION address_pool_ips_quarantine_remember();

-- a row written for an IP still in quarantine (a pool renamed, replaced, split or merged over it)
-- is quarantined as long
CREATE FUNCTION address_pool_ips_quarantine_inherit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.address_id IS NULL THEN
        NEW.reusable_after := greatest(NEW.reusable_after,
                                       (SELECT q.reusable_after
                                        FROM address_quarantine q JOIN address_pools p ON p.region = q.region
                                        WHERE p.id = NEW.pool_id AND q.ip = NEW.ip AND q.reusable_after > now()));
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER address_pool_ips_quarantine_inherit
    BEFORE INSERT ON address_pool_ips
    FOR EACH ROW
    EXECUTE FUNCTION address_pool_ips_quarantine_inherit();

-- the quarantines already running when this migration runs
INSERT INTO address_quarantine (region, ip, reusable_after)
SELECT p.region, i.ip, max(i.reusable_after)
FROM address_pool_ips i JOIN address_pools p ON p.id = i.pool_id
WHERE i.reusable_after > now()
GROUP BY p.region, i.ip
ON CONFLICT (region, ip) DO NOTHING;

CREATE INDEX api_tokens_created_by ON api_tokens (created_by) WHERE created_by IS NOT NULL;

ALTER TABLE cluster_keys ADD COLUMN client_ca_rotated_at timestamptz;

CREATE TABLE cluster_credentials (
    serial      text PRIMARY KEY CHECK (serial ~ '^[0-9a-f]{1,40}$'),  -- the certificate's, hex
    cluster_id  text NOT NULL REFERENCES clusters (id),
    tenant_id   text NOT NULL REFERENCES tenants (id),
    token_id    text,                 -- the API token that minted it
    username    text NOT NULL,        -- the certificate's CN
    created_at  timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL,
    CHECK (expires_at > created_at)
);
CREATE INDEX cluster_credentials_cluster ON cluster_credentials (cluster_id, created_at);
-- z9 schema, version 17: every guest's address known to z9, so its Proxmox IP filter can hold it;
-- and a quota of load balancers.
--
-- A guest without an address of its own from a pool (a server without a primary address, a
-- Kubernetes cluster's members) used to take DHCP from the bridge: z9 could not know its lease, so
-- its IP filter stayed off and the guest could claim any address on the bridge. With a region's
-- private_network set, z9 chooses each such VM's address itself — one row per (resource, member),
-- taken by the VM's job before the VM's first start and written as its static cloud-init network
-- and as the only address in its ipfilter-net0 — and releases it when the VM is gone (the member
-- removed, the resource deleted). A released IP is kept from reuse until reusable_after (the
-- network's quarantine_s, copied at allocation), keyed by (region, ip) whatever the network's
-- settings become. Two live rows of a region never share an IP; a member has one live row.

CREATE TABLE vm_private_addresses (
    resource_id     text NOT NULL,
    member          text NOT NULL,
    region          text NOT NULL,
    ip              inet NOT NULL CHECK (family(ip) = 4 AND masklen(ip) = 32),
    quarantine_s    integer NOT NULL CHECK (quarantine_s >= 0),
    allocated_at    timestamptz NOT NULL DEFAULT now(),
    released_at     timestamptz,
    reusable_after  timestamptz,
    CHECK ((released_at IS NULL) = (reusable_after IS NULL))
);
CREATE UNIQUE INDEX vm_private_addresses_member_live ON vm_private_addresses (resource_id, member)
    WHERE released_at IS NULL;
CREATE UNIQUE INDEX vm_private_addresses_ip_live ON vm_private_addresses (region, ip) WHERE released_at IS NULL;
CREATE INDEX vm_private_addresses_quarantined ON vm_private_addresses (region, ip) INCLUDE (reusable_after)
    WHERE released_at IS NOT NULL;

-- A quota of load balancers per tenant (NULL: Z9_QUOTA_LOAD_BALANCERS): each one is up to three
-- addresses but also two VMs and their health checks on the shared hypervisor, which the address
-- quota alone did not bound.
ALTER TABLE tenant_quotas ADD COLUMN load_balancers integer CHECK (load_balancers >= 0);

-- migration 0018: volumes (see db/z9/db/migrations/0018_volumes.sql)
CREATE TYPE volume_status AS ENUM ('creating', 'available', 'attached', 'deleting', 'destroying', 'deleted', 'failed');

CREATE TABLE volumes (
    id                    text PRIMARY KEY CHECK (id ~ '^vol_[0-9a-z]{26}$'),
    tenant_id             text NOT NULL REFERENCES tenants (id),
    region                text NOT NULL,
    name                  text NOT NULL CHECK (name ~ '^[a-z0-9][a-z0-9-]{0,62}$'),
    size_gib              integer NOT NULL CHECK (size_gib BETWEEN 1 AND 65536),
    storage               text NOT NULL CHECK (length(storage) BETWEEN 1 AND 63),
    server_id             text REFERENCES servers (id),
    labels                jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(labels) = 'object'),
    status                volume_status NOT NULL DEFAULT 'creating',
    status_reason         text,
    status_before_delete  volume_status,
    server_before_delete  text REFERENCES servers (id),
    delete_after          timestamptz,
    observed              jsonb,
    observed_at           timestamptz,
    created_at            timestamptz NOT NULL DEFAULT now(),
    updated_at            timestamptz NOT NULL DEFAULT now(),
    deleted_at            timestamptz,
    CHECK (status <> 'deleting' OR delete_after IS NOT NULL),
    CHECK ((status = 'deleted') = (deleted_at IS NOT NULL)),
    CHECK (status NOT IN ('deleting', 'destroying', 'deleted') OR server_id IS NULL)
);

CREATE UNIQUE INDEX volumes_tenant_name_live ON volumes (tenant_id, name) WHERE status <> 'deleted';
CREATE INDEX volumes_tenant_id ON volumes (tenant_id, id);
CREATE INDEX volumes_server ON volumes (server_id) WHERE server_id IS NOT NULL;
CREATE INDEX volumes_deletion_due ON volumes (delete_after) WHERE status = 'deleting';

-- grow only: a size never goes down (the API answers 422 first; this is the last line)
CREATE FUNCTION volumes_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.size_gib < OLD.size_gib THEN
        RAISE EXCEPTION 'volume % is % GiB; volumes never shrink', OLD.id, OLD.size_gib
            USING ERRCODE = 'check_violation', CONSTRAINT = 'volumes_never_shrink';
    END IF;
    IF NEW.status IN ('deleting', 'destroying') AND OLD.status NOT IN ('deleting', 'destroying') THEN
        NEW.server_before_delete := OLD.server_id;
        NEW.server_id := NULL;
    ELSIF OLD.status = 'deleting' AND NEW.status NOT IN ('deleting', 'destroying', 'deleted') THEN
        NEW.server_id := (SELECT s.id FROM servers s WHERE s.id = OLD.server_before_delete
                          AND s.status NOT IN ('deleting', 'destroying', 'deleted'));
        NEW.status := CASE WHEN NEW.server_id IS NULL AND NEW.status = 'attached' THEN 'available'
                           ELSE NEW.status END;
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER volumes_guard
    BEFORE UPDATE OF status, size_gib ON volumes
    FOR EACH ROW
    EXECUTE FUNCTION volumes_guard();

-- the volume_gib quota: a tenant's live volumes' sizes (NULL: the Z9_QUOTA_VOLUME_GIB default)
ALTER TABLE tenant_quotas ADD COLUMN volume_gib bigint CHECK (volume_gib >= 0);

-- z9 schema, version 19: the web console's sessions, server-side and opaque.
--
-- The console's cookie used to hold the raw API token, so signing out only asked the browser to
-- forget it: a copy of the cookie kept working. Now signing in makes one row here (a random
-- session id, of which only its SHA-256 is stored, and the token it authenticates as) and the
-- cookie holds the session id. Every cookie-authenticated request finds its session (live: not
-- revoked, not expired) and then passes the same checks as its token (a revoked or expired token,
-- or one of a revoked line, ends its sessions). Signing out sets revoked_at. expires_at moves
-- forward with use (Z9_CONSOLE_SESSION_IDLE_S, written at most once a minute) and never past
-- created_at + Z9_CONSOLE_SESSION_MAX_S. The scheduler deletes the rows ended more than a day ago.
CREATE TABLE console_sessions (
    session_sha256  bytea PRIMARY KEY CHECK (length(session_sha256) = 32),
    token_id        text NOT NULL REFERENCES api_tokens (id) ON DELETE CASCADE,
    created_at      timestamptz NOT NULL DEFAULT now(),
    expires_at      timestamptz NOT NULL,
    revoked_at      timestamptz
);
CREATE INDEX console_sessions_token ON console_sessions (token_id);
-- the scheduler's prune deletes the rows ended (expired or signed out) more than a day ago
CREATE INDEX console_sessions_expires ON console_sessions (expires_at);

-- z9 schema, version 20: a tenant's own quota limits, one row per unit.
--
-- tenant_quotas kept a column per quota unit, so every kind with a quota of its own added one
-- (0017 load_balancers, 0018 volume_gib) and the code listed the units beside them. The units are
-- now the resource-type registry's (each slice declares its own: z9.resources.QuotaUnit), and a
-- tenant's own limits are rows (tenant, unit, quota): no row is the Z9_QUOTA_<UNIT> default; `z9
-- quota --<unit> N` writes one, `--<unit> default` deletes it. A unit is any plain identifier: the
-- registry, not the table, says which exist (a row of a unit no type declares is ignored).
--
-- Written to run while the previous release serves (README, Upgrades): its code reads and writes
-- tenant_quotas, so that table stays, and until a later migration drops it (with the two triggers
-- below) each table's writes are copied into the other: an override set through either release's
-- `z9 quota` holds for both releases' API (the other's own copy is not copied back: depth < 1).
-- tenant_quotas' integer columns take at most 2^31 - 1 (a larger limit reads as that there).
CREATE TABLE tenant_quota_limits (
    tenant_id   text NOT NULL REFERENCES tenants (id),
    unit        text NOT NULL CHECK (unit ~ '^[a-z][a-z0-9_]{0,62}$'),
    quota       bigint NOT NULL CHECK (quota >= 0),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, unit)
);

CREATE FUNCTION tenant_quotas_to_limits() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM tenant_quota_limits l
    USING (VALUES ('servers', NEW.servers::bigint), ('cores', NEW.cores::bigint), ('memory_mib', NEW.memory_mib),
                  ('addresses', NEW.addresses::bigint), ('load_balancers', NEW.load_balancers::bigint),
                  ('volume_gib', NEW.volume_gib)) AS u (unit, quota)
    WHERE l.tenant_id = NEW.tenant_id AND l.unit = u.unit AND u.quota IS NULL;
    INSERT INTO tenant_quota_limits AS l (tenant_id, unit, quota)
    SELECT NEW.tenant_id, u.unit, u.quota
    FROM (VALUES ('servers', NEW.servers::bigint), ('cores', NEW.cores::bigint), ('memory_mib', NEW.memory_mib),
                 ('addresses', NEW.addresses::bigint), ('load_balancers', NEW.load_balancers::bigint),
                 ('volume_gib', NEW.volume_gib)) AS u (unit, quota)
    WHERE u.quota IS NOT NULL
    ON CONFLICT (tenant_id, unit) DO UPDATE SET quota = EXCLUDED.quota, updated_at = now()
    WHERE l.quota IS DISTINCT FROM EXCLUDED.quota;
    RETURN NULL;
END
$$;

CREATE TRIGGER tenant_quotas_to_limits
    AFTER INSERT OR UPDATE ON tenant_quotas
    FOR EACH ROW WHEN (pg_trigger_depth() < 1)
    EXECUTE FUNCTION tenant_quotas_to_limits();

-- the overrides set so far (the trigger above took tenant_quotas' lock: no write of the serving release
-- falls between this copy and the trigger; the copy is not copied back: the trigger below comes after it)
INSERT INTO tenant_quota_limits (tenant_id, unit, quota, updated_at)
SELECT t.tenant_id, u.unit, u.quota, t.updated_at
FROM tenant_quotas t
CROSS JOIN LATERAL (VALUES ('servers', t.servers::bigint), ('cores', t.cores::bigint), ('memory_mib', t.memory_mib),
                           ('addresses', t.addresses::bigint), ('load_balancers', t.load_balancers::bigint),
                           ('volume_gib', t.volume_gib)) AS u (unit, quota)
WHERE u.quota IS NOT NULL;

CREATE FUNCTION tenant_quota_limits_to_columns() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    v_tenant text := CASE WHEN TG_OP = 'DELETE' THEN OLD.tenant_id ELSE NEW.tenant_id END;
    v_unit text := CASE WHEN TG_OP = 'DELETE' THEN OLD.unit ELSE NEW.unit END;
    v_quota bigint := CASE WHEN TG_OP = 'DELETE' THEN NULL ELSE least(NEW.quota, 2147483647) END;
BEGIN
    IF v_unit IN ('servers', 'cores', 'memory_mib', 'addresses', 'load_balancers', 'volume_gib') THEN
        EXECUTE format('INSERT INTO tenant_quotas (tenant_id, %1$I) VALUES ($1, $2) '
                       'ON CONFLICT (tenant_id) DO UPDATE SET %1$I = $2, updated_at = now()', v_unit)
        USING v_tenant, v_quota;
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER tenant_quota_limits_to_columns
    AFTER INSERT OR UPDATE OR DELETE ON tenant_quota_limits
    FOR EACH ROW WHEN (pg_trigger_depth() < 1)
    EXECUTE FUNCTION tenant_quota_limits_to_columns();


-- networks (migration 0026)
CREATE TYPE network_status AS ENUM ('creating', 'available', 'deleting', 'destroying', 'deleted', 'failed');

CREATE TABLE networks (
    id                    text PRIMARY KEY CHECK (id ~ '^net_[0-9a-z]{26}$'),
    tenant_id             text NOT NULL REFERENCES tenants (id),
    region                text NOT NULL,
    name                  text NOT NULL CHECK (name ~ '^[a-z0-9][a-z0-9-]{0,62}$'),
    ip_range              cidr NOT NULL CHECK (family(ip_range) = 4 AND masklen(ip_range) BETWEEN 16 AND 28
                                               AND (ip_range <<= '10.0.0.0/8' OR ip_range <<= '172.16.0.0/12'
                                                    OR ip_range <<= '192.168.0.0/16')),
    vni                   integer NOT NULL CHECK (vni BETWEEN 1 AND 16777215),
    vnet                  text NOT NULL CHECK (vnet ~ '^[a-z][a-z0-9]{0,6}[a-z0-9]$'),
    labels                jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(labels) = 'object'),
    status                network_status NOT NULL DEFAULT 'creating',
    status_reason         text,
    status_before_delete  network_status,
    delete_after          timestamptz,
    observed              jsonb,
    observed_at           timestamptz,
    created_at            timestamptz NOT NULL DEFAULT now(),
    updated_at            timestamptz NOT NULL DEFAULT now(),
    deleted_at            timestamptz,
    CHECK (status <> 'deleting' OR delete_after IS NOT NULL),
    CHECK ((status = 'deleted') = (deleted_at IS NOT NULL))
);

CREATE UNIQUE INDEX networks_tenant_name_live ON networks (tenant_id, name) WHERE status <> 'deleted';
-- a VXLAN id (VLAN tag) is one network's in its region until that network is deleted for good (its
-- VNet gone from the running config): pve-network refuses a VNI twice across every VXLAN zone
CREATE UNIQUE INDEX network_vni_live ON networks (region, vni) WHERE status <> 'deleted';
CREATE UNIQUE INDEX network_vnet_live ON networks (region, vnet) WHERE status <> 'deleted';
CREATE INDEX networks_tenant_id ON networks (tenant_id, id);
CREATE INDEX networks_deletion_due ON networks (delete_after) WHERE status = 'deleting';

-- A member: a server on a network, by its NIC (net1…net31: net0 is the server's own) and the address
-- z9 gave it there (unique in the network: ip_not_available; every address of the range but its
-- network and broadcast addresses may be given). The row stays until the detach job has taken the NIC
-- off the VM: its address is not given again before (the order Hetzner's #586 lacked).
CREATE TABLE network_members (
    network_id  text NOT NULL REFERENCES networks (id),
    server_id   text NOT NULL REFERENCES servers (id),
    tenant_id   text NOT NULL REFERENCES tenants (id),
    ip          inet NOT NULL CHECK (family(ip) = 4 AND masklen(ip) = 32),
    nic         text NOT NULL CHECK (nic ~ '^net([1-9]|[12][0-9]|3[01])$'),
    state       text NOT NULL DEFAULT 'attaching' CHECK (state IN ('attaching', 'attached', 'detaching')),
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (network_id, server_id)
);
CREATE UNIQUE INDEX network_members_ip ON network_members (network_id, ip);
CREATE UNIQUE INDEX network_members_nic ON network_members (server_id, nic);

-- A region's SDN apply (one row per region that has networks): the apply job its next network edit
-- waits for (apply_job_id: pending, not yet started; NULL: the next edit enqueues one — the job
-- clears it as it starts, under this row's lock, so an edit is either seen by a running apply or
-- enqueues the next), the PVE 9 SDN lock token z9 holds (lock_token, taken by lock_job_id at
-- lock_taken_at: recorded before it is used, so a job after an executor died holding it releases
-- exactly this token and never one z9 did not mint), and what blocks the apply (condition: foreign
-- pending edits, a foreign lock, a node that failed to reload — null when nothing does).
CREATE TABLE sdn_regions (
    region         text PRIMARY KEY,
    apply_job_id   text,
    lock_token     text,
    lock_job_id    text,
    lock_taken_at  timestamptz,
    condition      jsonb CHECK (condition IS NULL OR jsonb_typeof(condition) = 'object'),
    applies        bigint NOT NULL DEFAULT 0,
    applied_at     timestamptz,
    updated_at     timestamptz NOT NULL DEFAULT now(),
    CHECK ((lock_token IS NULL) = (lock_job_id IS NULL))
);

-- migration 0027: firewalls (see db/z9/db/migrations/0027_firewalls.sql)
CREATE TYPE firewall_status AS ENUM ('creating', 'active', 'deleting', 'destroying', 'deleted', 'failed');

CREATE TABLE firewalls (
    id                    text PRIMARY KEY CHECK (id ~ '^fw_[0-9a-z]{26}$'),
    tenant_id             text NOT NULL REFERENCES tenants (id),
    region                text NOT NULL,
    name                  text NOT NULL CHECK (name ~ '^[a-z0-9][a-z0-9-]{0,62}$'),
    rules                 jsonb NOT NULL DEFAULT '[]' CHECK (jsonb_typeof(rules) = 'array' AND jsonb_array_length(rules) <= 50),
    applied_to            jsonb NOT NULL DEFAULT '[]' CHECK (jsonb_typeof(applied_to) = 'array'),
    generation            bigint NOT NULL DEFAULT 1 CHECK (generation >= 1),
    labels                jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(labels) = 'object'),
    status                firewall_status NOT NULL DEFAULT 'creating',
    status_reason         text,
    status_before_delete  firewall_status,
    delete_after          timestamptz,
    observed              jsonb,
    observed_at           timestamptz,
    created_at            timestamptz NOT NULL DEFAULT now(),
    updated_at            timestamptz NOT NULL DEFAULT now(),
    deleted_at            timestamptz,
    CHECK (status <> 'deleting' OR delete_after IS NOT NULL),
    CHECK ((status = 'deleted') = (deleted_at IS NOT NULL))
);

CREATE UNIQUE INDEX firewalls_tenant_name_live ON firewalls (tenant_id, name) WHERE status <> 'deleted';
CREATE INDEX firewalls_tenant_id ON firewalls (tenant_id, id);
CREATE INDEX firewalls_deletion_due ON firewalls (delete_after) WHERE status = 'deleting';

CREATE TYPE firewall_member_state AS ENUM ('pending', 'applied', 'removing');

CREATE TABLE firewall_members (
    firewall_id   text NOT NULL REFERENCES firewalls (id),
    server_id     text NOT NULL REFERENCES servers (id),
    via           text NOT NULL CHECK (via IN ('server', 'label_selector')),
    state         firewall_member_state NOT NULL DEFAULT 'pending',
    generation    bigint,                 -- the firewall's generation last seen applied on the VM
    enforced      boolean,                -- the datacenter firewall, the VM's and its NIC's switches on (NULL: not seen)
    detail        text,                   -- what the last check saw when not applied
    applied_at    timestamptz,
    updated_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (firewall_id, server_id)
);

CREATE INDEX firewall_members_server ON firewall_members (server_id);

-- each resource's drift state, as the reaper's periodic plan found it (0028)
CREATE TABLE resource_drift (
    resource_id    text PRIMARY KEY,
    resource_type  text NOT NULL,
    tenant_id      text NOT NULL,
    region         text NOT NULL,
    in_sync        boolean NOT NULL,
    job_kind       text,
    drift          jsonb NOT NULL DEFAULT '[]',
    steps          jsonb NOT NULL DEFAULT '[]',
    error          text,
    checked_at     timestamptz NOT NULL,
    drifted_since  timestamptz,
    CHECK ((drifted_since IS NULL) = in_sync)
);

CREATE INDEX resource_drift_drifted ON resource_drift (resource_type, drifted_since) WHERE NOT in_sync;

-- migration 0029: a volume's disk by every volid z9 recorded for it (see db/z9/db/migrations/0029_volume_disk_volids.sql)
ALTER TABLE volumes ADD COLUMN disk_volids text[] NOT NULL DEFAULT '{}';
CREATE INDEX volumes_region_disk_volids ON volumes (region) WHERE status <> 'deleted' AND disk_volids <> '{}';
