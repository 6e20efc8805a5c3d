-- z9 schema, version 12: fewer index entries per job (issue 14).
--
-- A job's status changes (pending → running → succeeded) are never HOT updates, so each version of
-- a job row gets an entry in every index whose predicate it matches: 18 entries over a job's life
-- before this migration (7 at insert, 6 at the claim, 5 at the finish) for a job without tenant or
-- resource, 18 for one with both. Each entry is WAL, buffer dirtying and, at concurrency, page
-- contention on the rightmost leaf of every seq- or time-ordered index. Now:
-- - the metric counts of live and of finished jobs (job_count_live / job_count_finished) read
--   columns INCLUDEd in the live-jobs index (jobs_resource_live) and in the pruning index
--   (jobs_finished), which every such version enters anyway: jobs_live_counts and
--   jobs_finished_counts go (each walked the same set of entries the widened index holds);
-- - jobs_resource and jobs_tenant leave out the jobs without a resource / tenant (z9's own jobs):
--   every query reaching them asks for `resource_id = …` / `tenant_id = …`, which no NULL matches.
-- Entries per job: 9 for a job without tenant or resource (W3's no-op jobs), 15 with both.

DROP INDEX jobs_live_counts;
DROP INDEX jobs_finished_counts;

DROP INDEX jobs_resource_live;
CREATE INDEX jobs_resource_live ON jobs (resource_id, seq) INCLUDE (status, region, kind)
    WHERE status IN ('pending', 'running', 'retry');

DROP INDEX jobs_finished;
CREATE INDEX jobs_finished ON jobs (finished_at) INCLUDE (status, region, kind)
    WHERE status IN ('succeeded', 'failed');

DROP INDEX jobs_resource;
CREATE INDEX jobs_resource ON jobs (resource_id, seq) WHERE resource_id IS NOT NULL;

DROP INDEX jobs_tenant;
CREATE INDEX jobs_tenant ON jobs (tenant_id, seq) WHERE tenant_id IS NOT NULL;
