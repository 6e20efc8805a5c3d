-- The claim walks jobs_claimable (region, seq) WHERE status = 'pending' in seq order and stops
-- after LIMIT rows. The unique index on seq offered the planner a second ordered path — the
-- whole table, finished jobs included — which it took whenever its statistics were stale (a
-- queue that was full of pending jobs at the last ANALYZE): every claim then stepped over all
-- the jobs finished since. seq is an identity column (GENERATED ALWAYS) and needs no unique
-- index; listings order by seq through (tenant_id, seq) and (resource_id, seq).
ALTER TABLE jobs DROP CONSTRAINT jobs_seq_key;
