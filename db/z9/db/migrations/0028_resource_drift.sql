-- z9 schema, version 28: each resource's drift state, as the reaper's periodic plan found it.
--
-- A plan (POST /v1/<plural>/{id}/actions/plan) runs the observe and plan of the resource's converging
-- job read-only; the reaper runs one for a bounded number of resources per region each pass
-- (Z9_DRIFT_INTERVAL_S, Z9_DRIFT_BATCH) and records here what it found: in sync or not, the drift
-- and the steps, when it was checked, and since when it has been drifted (kept across checks while
-- it stays drifted: the alert says "drifted for 30 minutes"). One row per resource of any registered
-- type (no foreign key: the types' tables are many); a row of a resource since deleted is left out
-- (every query joins its type's table on a live status).
CREATE TABLE resource_drift (
    resource_id    text PRIMARY KEY,
    resource_type  text NOT NULL,
    tenant_id      text NOT NULL,
    region         text NOT NULL,
    in_sync        boolean NOT NULL,
    job_kind       text,
    drift          jsonb NOT NULL DEFAULT '[]',
    steps          jsonb NOT NULL DEFAULT '[]',
    error          text,
    checked_at     timestamptz NOT NULL,
    drifted_since  timestamptz,
    CHECK ((drifted_since IS NULL) = in_sync)
);

CREATE INDEX resource_drift_drifted ON resource_drift (resource_type, drifted_since) WHERE NOT in_sync;
