-- z9 schema, version 2: indexes for the scheduler's job metrics (docs/metrics.md).
--
-- z9_jobs counts jobs by (kind, region, status) with index-only scans of two partial indexes:
-- the live jobs (few, recounted every few seconds) and the finished ones (most of the table,
-- recounted every minute). No index over the whole table: every update of a job (claim,
-- heartbeat, finish) would add an entry to it, and it would grow with the history; the finished
-- one gets a single entry per job, when it finishes (finished rows are never updated).
CREATE INDEX jobs_live_counts ON jobs (status, region, kind) WHERE status IN ('pending', 'running', 'retry');
CREATE INDEX jobs_finished_counts ON jobs (status, region, kind) WHERE status IN ('succeeded', 'failed');

-- z9_job_oldest_pending_age_seconds walks a region's pending jobs in run_after order up to the
-- first runnable one: the INCLUDE columns make that walk (and its per-resource probe of
-- jobs_resource_live) index-only.
CREATE INDEX jobs_pending_runnable ON jobs (region, run_after) INCLUDE (created_at, resource_id, seq)
    WHERE status = 'pending';
