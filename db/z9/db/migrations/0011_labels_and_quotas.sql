-- z9 schema, version 11: labels on every resource type, and per-tenant quotas.
--
-- labels: a lifecycle column like the others (every resource table has it): a JSON object of
-- string keys to string values (the API validates keys and values, Kubernetes-style); filtered by
-- GET /v1/<plural>?label_selector=. No index: a selector is applied within the tenant's rows,
-- walked in id order through <table>_tenant_id, and stops after `limit` matches.
ALTER TABLE servers ADD COLUMN labels jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(labels) = 'object');
ALTER TABLE addresses ADD COLUMN labels jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(labels) = 'object');
ALTER TABLE load_balancers ADD COLUMN labels jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(labels) = 'object');
ALTER TABLE clusters ADD COLUMN labels jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(labels) = 'object');

-- tenant_quotas: per-tenant overrides of the Z9_QUOTA_* defaults (NULL: the default), set by
-- `z9 quota`. The API checks a quota in the transaction that would exceed it, after taking the
-- tenant's quota lock (an advisory transaction lock): two requests can never both pass the last
-- unit. Use counts the tenant's rows not yet deleted (deleting/destroying still hold a VM or IP).
CREATE TABLE tenant_quotas (
    tenant_id   text PRIMARY KEY REFERENCES tenants (id),
    servers     integer CHECK (servers >= 0),
    cores       integer CHECK (cores >= 0),
    memory_mib  bigint CHECK (memory_mib >= 0),
    addresses   integer CHECK (addresses >= 0),
    updated_at  timestamptz NOT NULL DEFAULT now()
);
