-- z9 schema, version 1: tenants, API tokens, servers, jobs.
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
    revoked_at    timestamptz
);

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
    CHECK (status <> 'deleting' OR delete_after IS NOT NULL),
    CHECK ((status = 'deleted') = (deleted_at IS NOT NULL)),
    CHECK ((vmid IS NULL) = (node IS NULL))
);

CREATE UNIQUE INDEX servers_tenant_name_live ON servers (tenant_id, name) WHERE status <> 'deleted';
CREATE INDEX servers_tenant_id ON servers (tenant_id, id);
CREATE INDEX servers_deletion_due ON servers (delete_after) WHERE status = 'deleting';

CREATE TABLE jobs (
    id                text PRIMARY KEY CHECK (id ~ '^job_[0-9a-z]{26}$'),
    seq               bigint GENERATED ALWAYS AS IDENTITY UNIQUE,
    kind              text NOT NULL,
    region            text NOT NULL,
    tenant_id         text REFERENCES tenants (id),
    resource_type     text,
    resource_id       text,
    args              jsonb NOT NULL DEFAULT '{}',
    status            job_status NOT NULL DEFAULT 'pending',
    attempt           integer NOT NULL DEFAULT 0 CHECK (attempt >= 0),
    max_attempts      integer NOT NULL DEFAULT 10 CHECK (max_attempts >= 1),
    run_after         timestamptz NOT NULL DEFAULT now(),
    lease_owner       text,
    lease_expires_at  timestamptz,
    steps             jsonb NOT NULL DEFAULT '[]' CHECK (jsonb_typeof(steps) = 'array'),
    memo              jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(memo) = 'object'),
    error             jsonb CHECK (error IS NULL OR (error ? 'class' AND error ? 'message')),
    trace_context     jsonb,
    created_at        timestamptz NOT NULL DEFAULT now(),
    started_at        timestamptz,
    finished_at       timestamptz,
    updated_at        timestamptz NOT NULL DEFAULT now(),
    CHECK ((resource_type IS NULL) = (resource_id IS NULL)),
    CHECK ((lease_owner IS NULL) = (lease_expires_at IS NULL)),
    CHECK ((status = 'running') = (lease_owner IS NOT NULL)),
    CHECK ((status IN ('succeeded', 'failed')) = (finished_at IS NOT NULL)),
    CHECK (status <> 'failed' OR error IS NOT NULL)
);

-- Claim: pending jobs of a region in submission order.
CREATE INDEX jobs_claimable ON jobs (region, seq) WHERE status = 'pending';
-- Per-resource order: the earliest live job of a resource.
CREATE INDEX jobs_resource_live ON jobs (resource_id, seq) WHERE status IN ('pending', 'running', 'retry');
-- Scheduler: due retries and expired leases.
CREATE INDEX jobs_retry_due ON jobs (run_after) WHERE status = 'retry';
CREATE INDEX jobs_lease_expiry ON jobs (lease_expires_at) WHERE status = 'running';
-- Pruning finished jobs.
CREATE INDEX jobs_finished ON jobs (finished_at) WHERE status IN ('succeeded', 'failed');
-- Listing the jobs of a resource / tenant.
CREATE INDEX jobs_resource ON jobs (resource_id, seq);
CREATE INDEX jobs_tenant ON jobs (tenant_id, seq);

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
