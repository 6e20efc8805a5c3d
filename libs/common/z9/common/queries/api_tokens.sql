-- The api_tokens table.

-- name: api_token_insert
INSERT INTO api_tokens (id, tenant_id, name, token_sha256, scopes, expires_at, created_by)
VALUES ($1, $2, $3, $4, $5, $6, $7)
RETURNING id, tenant_id, name, scopes, created_at, expires_at, last_used_at, revoked_at, created_by;

-- name: api_token_tenant
SELECT t.id, t.name
FROM api_tokens k JOIN tenants t ON t.id = k.tenant_id
WHERE k.token_sha256 = $1 AND k.revoked_at IS NULL AND (k.expires_at IS NULL OR k.expires_at > coalesce($2::timestamptz, now()));

-- name: api_token_auth
-- The principal of a bearer token: unknown, revoked and expired tokens match nothing, nor does a
-- token any of whose ancestors (created_by, transitively: the token that made it, and so on) is
-- revoked or expired — a token never outlives its line. expires_at: the earliest along the line.
WITH RECURSIVE line AS (
    SELECT k.id, k.created_by, k.revoked_at, k.expires_at, 0 AS depth
    FROM api_tokens k WHERE k.token_sha256 = $1
    UNION ALL
    SELECT p.id, p.created_by, p.revoked_at, p.expires_at, line.depth + 1
    FROM api_tokens p JOIN line ON p.id = line.created_by
    WHERE line.depth < 100
)
SELECT k.id, k.tenant_id, k.scopes, (SELECT min(line.expires_at) FROM line) AS expires_at
FROM api_tokens k
WHERE k.token_sha256 = $1
  AND NOT EXISTS (SELECT 1 FROM line WHERE line.revoked_at IS NOT NULL OR line.expires_at <= coalesce($2::timestamptz, now()));

-- name: api_token_list
SELECT id, tenant_id, name, scopes, created_at, expires_at, last_used_at, revoked_at, created_by
FROM api_tokens
WHERE tenant_id = $1 AND ($2::text IS NULL OR id > $2) AND ($3 OR revoked_at IS NULL)
ORDER BY id
LIMIT $4;

-- name: api_token_revoke
-- Revoke token $1 of tenant $2 and every token it created, transitively (index
-- api_tokens_created_by). Revoking twice answers the tokens again (revoked_at unchanged): DELETE
-- is idempotent. Every row revoked (the token's own among them).
WITH RECURSIVE tree AS (
    SELECT id FROM api_tokens WHERE id = $1 AND tenant_id = $2
    UNION
    SELECT c.id FROM api_tokens c JOIN tree ON c.created_by = tree.id WHERE c.tenant_id = $2
)
UPDATE api_tokens k SET revoked_at = coalesce(k.revoked_at, now())
FROM tree WHERE k.id = tree.id
RETURNING k.id, k.tenant_id, k.name, k.scopes, k.created_at, k.expires_at, k.last_used_at, k.revoked_at,
          k.created_by;

-- name: api_token_touch
-- Coarse last use: only rows not touched within $2 seconds are written.
UPDATE api_tokens SET last_used_at = coalesce($3::timestamptz, now())
WHERE id = ANY($1::text[]) AND (last_used_at IS NULL OR last_used_at < coalesce($3::timestamptz, now()) - make_interval(secs => $2));
