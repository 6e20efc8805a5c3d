-- The idempotency_keys table.

-- name: idempotency_lock
SELECT pg_advisory_xact_lock(hashtextextended($1, 31289));

-- name: idempotency_get
SELECT request_sha256, response_status, response_body
FROM idempotency_keys WHERE tenant_id = $1 AND key = $2;

-- name: idempotency_prune
DELETE FROM idempotency_keys WHERE created_at < coalesce($2::timestamptz, now()) - make_interval(secs => $1);

-- name: idempotency_insert
INSERT INTO idempotency_keys (tenant_id, key, request_sha256, response_status, response_body)
VALUES ($1, $2, $3, $4, $5);
