-- z9 schema, version 2: indexes for the scheduler's job metrics (docs/metrics.md).
--
-- z9_jobs counts jobs by (kind, region, status) every few seconds: an index-only scan of
-- jobs_status_counts reads neither the heap nor the jsonb columns, so a million rows cost a
-- narrow index scan rather than a table scan.
CREATE INDEX jobs_status_counts ON jobs (status, region, kind);

-- z9_job_oldest_pending_age_seconds walks a region's pending jobs in run_after order up to the
-- first runnable one: the INCLUDE columns make that walk (and its per-resource probe of
-- jobs_resource_live) index-only.
CREATE INDEX jobs_pending_runnable ON jobs (region, run_after) INCLUDE (created_at, resource_id, seq)
    WHERE status = 'pending';
