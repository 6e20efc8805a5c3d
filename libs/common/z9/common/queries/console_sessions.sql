-- The console_sessions table (the web console's server-side sessions, migration 0019).

-- name: console_session_insert
INSERT INTO console_sessions (session_sha256, token_id, created_at, expires_at)
VALUES ($1, $2, coalesce($4::timestamptz, now()),
        coalesce($4::timestamptz, now()) + make_interval(secs => least($3::float8, $5::float8)))
RETURNING expires_at;

-- name: console_session_resolve
-- A live session ($1: its id's SHA-256) and its token's hash; its expiry moves to now + $3 s (the
-- idle cap, never past created_at + $4 s) when that is more than a minute later than it is.
UPDATE console_sessions s
SET expires_at = CASE WHEN s.expires_at < least(coalesce($2::timestamptz, now()) + make_interval(secs => $3::float8),
                                               s.created_at + make_interval(secs => $4::float8)) - interval '60 seconds'
                      THEN least(coalesce($2::timestamptz, now()) + make_interval(secs => $3::float8),
                                 s.created_at + make_interval(secs => $4::float8))
                      ELSE s.expires_at END
FROM api_tokens k
WHERE s.session_sha256 = $1 AND k.id = s.token_id AND s.revoked_at IS NULL
  AND s.expires_at > coalesce($2::timestamptz, now())
RETURNING s.token_id, k.token_sha256, s.expires_at;

-- name: console_session_revoke
UPDATE console_sessions SET revoked_at = coalesce(revoked_at, coalesce($2::timestamptz, now()))
WHERE session_sha256 = $1
RETURNING token_id;

-- name: console_session_prune
-- Sessions ended (expired, or signed out) more than $1 seconds ago.
DELETE FROM console_sessions
WHERE expires_at < coalesce($2::timestamptz, now()) - make_interval(secs => $1::float8)
   OR revoked_at < coalesce($2::timestamptz, now()) - make_interval(secs => $1::float8);
