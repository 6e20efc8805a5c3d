-- z9 schema, version 15: what a tenant's tokens, kubeconfigs and released addresses can reach.
--
-- 1. Quarantine keyed by address, not by pool row. address_pool_ips.reusable_after belongs to a
--    pool's row: a pool replaced by another over the same range (renamed in Z9_REGIONS, split,
--    merged, then `z9 migrate`) got fresh rows without it, and the next allocation handed out an IP
--    released seconds before. address_quarantine remembers, per region and IP, until when the
--    last release keeps it unallocatable; the table keeps it in step with every release (a
--    trigger: the five statements that release an address stay as they are) and gives it to every
--    row a pool sync inserts for that IP (a trigger on the insert), whatever pool it belongs to.
-- 2. Token lineage: revoking a token revokes the tokens it created, transitively (an index on
--    created_by for the walk).
-- 3. Kubeconfigs: each minted client certificate is recorded (who, when, until when, its serial),
--    and a cluster's client CA can be rotated (cluster_keys.client_ca_rotated_at: certificates
--    minted before it are no longer trusted by the cluster's API servers once the rotation's
--    reconcile has pushed the new bundle).

CREATE TABLE address_quarantine (
    region          text NOT NULL,
    ip              inet NOT NULL,
    reusable_after  timestamptz NOT NULL,
    PRIMARY KEY (region, ip)
);

-- a release (reusable_after set on a row) is remembered by (region, ip); a later write of the
-- row's quarantine (an operator shortening it by hand, a test) is the one remembered
CREATE FUNCTION address_pool_ips_quarantine_remember() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO address_quarantine (region, ip, reusable_after)
    SELECT p.region, NEW.ip, NEW.reusable_after FROM address_pools p WHERE p.id = NEW.pool_id
    ON CONFLICT (region, ip) DO UPDATE SET reusable_after = EXCLUDED.reusable_after;
    RETURN NULL;
END
$$;

CREATE TRIGGER address_pool_ips_quarantine_remember
    AFTER UPDATE OF reusable_after ON address_pool_ips
    FOR EACH ROW
    WHEN (NEW.reusable_after IS NOT NULL AND NEW.reusable_after IS DISTINCT FROM OLD.reusable_after)
    EXECUTE FUNCTION address_pool_ips_quarantine_remember();

-- a row written for an IP still in quarantine (a pool renamed, replaced, split or merged over it)
-- is quarantined as long
CREATE FUNCTION address_pool_ips_quarantine_inherit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.address_id IS NULL THEN
        NEW.reusable_after := greatest(NEW.reusable_after,
                                       (SELECT q.reusable_after
                                        FROM address_quarantine q JOIN address_pools p ON p.region = q.region
                                        WHERE p.id = NEW.pool_id AND q.ip = NEW.ip AND q.reusable_after > now()));
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER address_pool_ips_quarantine_inherit
    BEFORE INSERT ON address_pool_ips
    FOR EACH ROW
    EXECUTE FUNCTION address_pool_ips_quarantine_inherit();

-- the quarantines already running when this migration runs
INSERT INTO address_quarantine (region, ip, reusable_after)
SELECT p.region, i.ip, max(i.reusable_after)
FROM address_pool_ips i JOIN address_pools p ON p.id = i.pool_id
WHERE i.reusable_after > now()
GROUP BY p.region, i.ip
ON CONFLICT (region, ip) DO NOTHING;

CREATE INDEX api_tokens_created_by ON api_tokens (created_by) WHERE created_by IS NOT NULL;

ALTER TABLE cluster_keys ADD COLUMN client_ca_rotated_at timestamptz;

CREATE TABLE cluster_credentials (
    serial      text PRIMARY KEY CHECK (serial ~ '^[0-9a-f]{1,40}$'),  -- the certificate's, hex
    cluster_id  text NOT NULL REFERENCES clusters (id),
    tenant_id   text NOT NULL REFERENCES tenants (id),
    token_id    text,                 -- the API token that minted it
    username    text NOT NULL,        -- the certificate's CN
    created_at  timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL,
    CHECK (expires_at > created_at)
);
CREATE INDEX cluster_credentials_cluster ON cluster_credentials (cluster_id, created_at);
