-- z9 schema, version 20: a tenant's own quota limits, one row per unit.
--
-- tenant_quotas kept a column per quota unit, so every kind with a quota of its own added one
-- (0017 load_balancers, 0018 volume_gib) and the code listed the units beside them. The units are
-- now the resource-type registry's (each slice declares its own: z9.resources.QuotaUnit), and a
-- tenant's own limits are rows (tenant, unit, quota): no row is the Z9_QUOTA_<UNIT> default; `z9
-- quota --<unit> N` writes one, `--<unit> default` deletes it. A unit is any plain identifier: the
-- registry, not the table, says which exist (a row of a unit no type declares is ignored).
--
-- Written to run while the previous release serves (README, Upgrades): its code reads and writes
-- tenant_quotas, so that table stays, and until a later migration drops it (with the two triggers
-- below) each table's writes are copied into the other: an override set through either release's
-- `z9 quota` holds for both releases' API (the other's own copy is not copied back: depth < 1).
-- tenant_quotas' integer columns take at most 2^31 - 1 (a larger limit reads as that there).
CREATE TABLE tenant_quota_limits (
    tenant_id   text NOT NULL REFERENCES tenants (id),
    unit        text NOT NULL CHECK (unit ~ '^[a-z][a-z0-9_]{0,62}$'),
    quota       bigint NOT NULL CHECK (quota >= 0),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, unit)
);

CREATE FUNCTION tenant_quotas_to_limits() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM tenant_quota_limits l
    USING (VALUES ('servers', NEW.servers::bigint), ('cores', NEW.cores::bigint), ('memory_mib', NEW.memory_mib),
                  ('addresses', NEW.addresses::bigint), ('load_balancers', NEW.load_balancers::bigint),
                  ('volume_gib', NEW.volume_gib)) AS u (unit, quota)
    WHERE l.tenant_id = NEW.tenant_id AND l.unit = u.unit AND u.quota IS NULL;
    INSERT INTO tenant_quota_limits AS l (tenant_id, unit, quota)
    SELECT NEW.tenant_id, u.unit, u.quota
    FROM (VALUES ('servers', NEW.servers::bigint), ('cores', NEW.cores::bigint), ('memory_mib', NEW.memory_mib),
                 ('addresses', NEW.addresses::bigint), ('load_balancers', NEW.load_balancers::bigint),
                 ('volume_gib', NEW.volume_gib)) AS u (unit, quota)
    WHERE u.quota IS NOT NULL
    ON CONFLICT (tenant_id, unit) DO UPDATE SET quota = EXCLUDED.quota, updated_at = now()
    WHERE l.quota IS DISTINCT FROM EXCLUDED.quota;
    RETURN NULL;
END
$$;

CREATE TRIGGER tenant_quotas_to_limits
    AFTER INSERT OR UPDATE ON tenant_quotas
    FOR EACH ROW WHEN (pg_trigger_depth() < 1)
    EXECUTE FUNCTION tenant_quotas_to_limits();

-- the overrides set so far (the trigger above took tenant_quotas' lock: no write of the serving release
-- falls between this copy and the trigger; the copy is not copied back: the trigger below comes after it)
INSERT INTO tenant_quota_limits (tenant_id, unit, quota, updated_at)
SELECT t.tenant_id, u.unit, u.quota, t.updated_at
FROM tenant_quotas t
CROSS JOIN LATERAL (VALUES ('servers', t.servers::bigint), ('cores', t.cores::bigint), ('memory_mib', t.memory_mib),
                           ('addresses', t.addresses::bigint), ('load_balancers', t.load_balancers::bigint),
                           ('volume_gib', t.volume_gib)) AS u (unit, quota)
WHERE u.quota IS NOT NULL;

CREATE FUNCTION tenant_quota_limits_to_columns() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    v_tenant text := CASE WHEN TG_OP = 'DELETE' THEN OLD.tenant_id ELSE NEW.tenant_id END;
    v_unit text := CASE WHEN TG_OP = 'DELETE' THEN OLD.unit ELSE NEW.unit END;
    v_quota bigint := CASE WHEN TG_OP = 'DELETE' THEN NULL ELSE least(NEW.quota, 2147483647) END;
BEGIN
    IF v_unit IN ('servers', 'cores', 'memory_mib', 'addresses', 'load_balancers', 'volume_gib') THEN
        EXECUTE format('INSERT INTO tenant_quotas (tenant_id, %1$I) VALUES ($1, $2) '
                       'ON CONFLICT (tenant_id) DO UPDATE SET %1$I = $2, updated_at = now()', v_unit)
        USING v_tenant, v_quota;
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER tenant_quota_limits_to_columns
    AFTER INSERT OR UPDATE OR DELETE ON tenant_quota_limits
    FOR EACH ROW WHEN (pg_trigger_depth() < 1)
    EXECUTE FUNCTION tenant_quota_limits_to_columns();

