-- z9 schema, version 7: token management (scopes, expiry, last use) and who asked for each job.
--
-- api_tokens.scopes: 'read' (GET only), 'write' (mutations), 'operator' (sees platform details
-- such as the Proxmox user inside UPIDs; granted only by `z9 token --scope operator`, never
-- through the API). Tokens made before this migration keep full tenant rights: read and write.
-- last_used_at is coarse: each API process writes it at most once per
-- Z9_API_TOKEN_LAST_USED_S per token, never once per request.
-- created_by: the token that made this one through POST /v1/tokens (NULL: `z9 token`).
ALTER TABLE api_tokens
    ADD COLUMN scopes text[] NOT NULL DEFAULT '{read,write}'
        CHECK (scopes <@ '{read,write,operator}'::text[] AND cardinality(scopes) >= 1),
    ADD COLUMN expires_at timestamptz,
    ADD COLUMN last_used_at timestamptz,
    ADD COLUMN created_by text;

CREATE INDEX api_tokens_tenant ON api_tokens (tenant_id, id);

-- jobs.actor_token_id: the API token whose request made the job (NULL: made by z9 itself, e.g.
-- the reaper's final ServerDelete). jobs.request_id: that request's X-Request-Id. Neither is
-- indexed: GET /v1/jobs?actor= walks the tenant's jobs in seq order (jobs_tenant) and stops
-- after `limit` matches; an index over every job would take an entry on every job update.
ALTER TABLE jobs
    ADD COLUMN actor_token_id text,
    ADD COLUMN request_id text CHECK (length(request_id) <= 200);
