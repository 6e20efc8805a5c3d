-- z9 schema, version 14: the jobs table's one-column checks as domains (issue 14).
--
-- PostgreSQL evaluates every CHECK constraint of a table on every UPDATE of a row, and prepares
-- each one again (its stored expression read back and planned) for every execution of a
-- statement: the claim and the finish of every job paid for all thirteen of jobs' checks, about
-- a tenth of the database's CPU per job at concurrency 1 (perf, 2026-12-01). A domain's check runs
-- when a value is assigned to the column (an INSERT, or an UPDATE that sets it) and is prepared
-- once per connection. The invariants are the same; the checks that relate several columns stay
-- on the table (they must hold after every change).
--
-- `id` keeps its table check: a domain would also type a query parameter compared with it
-- (`WHERE id = $1`), and a malformed id asked for by a client must find nothing, not fail.
--
-- The domains are created without their checks, the columns changed to them (binary-coercible:
-- no rewrite, indexes kept), the table checks dropped, then each domain's check added and
-- validated (a scan of jobs, which the table checks already guaranteed).
CREATE DOMAIN job_attempt AS integer;
CREATE DOMAIN job_max_attempts AS integer;
CREATE DOMAIN job_steps AS jsonb;
CREATE DOMAIN job_memo AS jsonb;
CREATE DOMAIN job_error AS jsonb;
CREATE DOMAIN job_request_id AS text;

ALTER TABLE jobs
    DROP CONSTRAINT jobs_attempt_check,
    DROP CONSTRAINT jobs_max_attempts_check,
    DROP CONSTRAINT jobs_steps_check,
    DROP CONSTRAINT jobs_memo_check,
    DROP CONSTRAINT jobs_error_check,
    DROP CONSTRAINT jobs_request_id_check,
    ALTER COLUMN attempt TYPE job_attempt,
    ALTER COLUMN max_attempts TYPE job_max_attempts,
    ALTER COLUMN steps TYPE job_steps,
    ALTER COLUMN memo TYPE job_memo,
    ALTER COLUMN error TYPE job_error,
    ALTER COLUMN request_id TYPE job_request_id;

ALTER DOMAIN job_attempt ADD CONSTRAINT jobs_attempt_check CHECK (VALUE >= 0);
ALTER DOMAIN job_max_attempts ADD CONSTRAINT jobs_max_attempts_check CHECK (VALUE >= 1);
ALTER DOMAIN job_steps ADD CONSTRAINT jobs_steps_check CHECK (jsonb_typeof(VALUE) = 'array');
ALTER DOMAIN job_memo ADD CONSTRAINT jobs_memo_check CHECK (jsonb_typeof(VALUE) = 'object');
ALTER DOMAIN job_error ADD CONSTRAINT jobs_error_check CHECK (VALUE IS NULL OR (VALUE ? 'class' AND VALUE ? 'message'));
ALTER DOMAIN job_request_id ADD CONSTRAINT jobs_request_id_check CHECK (length(VALUE) <= 200);

-- PL/pgSQL plans a function's expressions once per session and keeps, for each field of a record
-- variable, the type it had then: jobs_finish_and_claim (migration 0012) reads `r.attempt`, an
-- integer until now, so in every session that had run it (an executor's pooled connections) it
-- would fail from this commit on, for good ("type of parameter … (job_attempt) does not match that
-- when preparing the plan (integer)"). Rewriting its catalog row (setting what it already says)
-- makes every session compile it again at its next call. No other function reads a retyped column
-- through a record (tests/test_break0014_live_upgrade.py).
ALTER FUNCTION jobs_finish_and_claim(text[], text[], int[], text[], text, int, text, float8)
    SET plan_cache_mode = force_generic_plan;
