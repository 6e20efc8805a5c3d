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
