-- z9 schema, version 8: load balancers (issue 10).
--
-- A load balancer is one or two HAProxy appliance VMs (members lb-0, lb-1) in front of targets
-- (servers or IPs). Its configuration is rendered from these rows; the sha256 of the rendering is
-- the desired state (config_hash, written by the API in the transaction that changes the rows,
-- with the configure job). Health is what the last verify or observe job read from HAProxy,
-- joined with what only z9 knows (a target server stopped or deleted).
--
-- Lifecycle (status), like servers':
--
--   creating ──job verified──> active ──DELETE──> deleting ──buffer expired (reaper)──> destroying ──> deleted
--      │                         ^                   │ cancel-deletion (within the buffer)
--      └──permanent error──> failed                  └──────────> back to status_before_delete
--
-- Addresses: the VIP and each appliance's own address are rows of `addresses` (kind
-- 'load_balancer', load_balancer_id set; lb_member NULL for the VIP, else the member), allocated
-- from the region's pool in the API transaction that inserts the load balancer, released in the
-- transaction that finishes its final delete (after verify saw its VMs gone). The addresses
-- table refuses to delete, assign or unassign them on their own (the trigger below).

CREATE TYPE load_balancer_status AS ENUM ('creating', 'active', 'deleting', 'destroying', 'deleted', 'failed');

CREATE TABLE load_balancers (
    id                    text PRIMARY KEY CHECK (id ~ '^lb_[0-9a-z]{26}$'),
    tenant_id             text NOT NULL REFERENCES tenants (id),
    region                text NOT NULL,
    name                  text NOT NULL CHECK (name ~ '^[a-z0-9][a-z0-9-]{0,62}$'),
    type                  text NOT NULL CHECK (type IN ('lb-small', 'lb-ha')),
    algorithm             text NOT NULL CHECK (algorithm IN ('round_robin', 'least_connections')),
    services              jsonb NOT NULL DEFAULT '[]',  -- [{protocol, listen_port, ..., health_check}]
    targets               jsonb NOT NULL DEFAULT '[]',  -- [{type: server, server_id} | {type: ip, ip}]
    addresses             jsonb NOT NULL DEFAULT '{}',  -- {vip|lb-0|lb-1: {id, ip, prefix, gateway}}: fixed at create
    config_hash           text,                 -- sha256 of the rendered HAProxy config (desired)
    config_version        bigint NOT NULL DEFAULT 1,  -- +1 with every change of services/targets/algorithm
    status                load_balancer_status NOT NULL DEFAULT 'creating',
    status_reason         text,
    status_before_delete  load_balancer_status,
    delete_after          timestamptz,
    health                text NOT NULL DEFAULT 'unknown'
                          CHECK (health IN ('healthy', 'degraded', 'unhealthy', 'unknown')),
    health_detail         jsonb,                -- {targets: {key: [{listen_port, status, reason}]}}
    health_at             timestamptz,
    observed              jsonb,                -- members (vmid, node, running, config hash, holds VIP)
    observed_at           timestamptz,
    created_at            timestamptz NOT NULL DEFAULT now(),
    updated_at            timestamptz NOT NULL DEFAULT now(),
    deleted_at            timestamptz,
    CHECK (status <> 'deleting' OR delete_after IS NOT NULL),
    CHECK ((status = 'deleted') = (deleted_at IS NOT NULL))
);
CREATE UNIQUE INDEX load_balancers_tenant_name_live ON load_balancers (tenant_id, name) WHERE status <> 'deleted';
CREATE INDEX load_balancers_tenant_id ON load_balancers (tenant_id, id);
-- every live load balancer targeting a server (its final delete reconfigures them):
-- targets @> '[{"server_id": "srv_…"}]'
CREATE INDEX load_balancers_targets ON load_balancers USING gin (targets jsonb_path_ops) WHERE status <> 'deleted';
CREATE INDEX load_balancers_deletion_due ON load_balancers (delete_after) WHERE status = 'deleting';
-- the periodic health refresh's scan (live load balancers, stalest first)
CREATE INDEX load_balancers_observe_due ON load_balancers (observed_at NULLS FIRST)
    WHERE status IN ('active', 'failed');

ALTER TABLE addresses DROP CONSTRAINT addresses_kind_check;
ALTER TABLE addresses
    ADD CONSTRAINT addresses_kind_check CHECK (kind IN ('primary', 'floating', 'load_balancer')),
    ADD COLUMN load_balancer_id text REFERENCES load_balancers (id) DEFERRABLE INITIALLY DEFERRED,
    ADD COLUMN lb_member text CHECK (lb_member ~ '^lb-[0-9]$'),
    ADD CONSTRAINT addresses_load_balancer_owned
        CHECK ((kind = 'load_balancer') = (load_balancer_id IS NOT NULL)
               AND (lb_member IS NULL OR kind = 'load_balancer')
               AND (kind <> 'load_balancer' OR server_id IS NULL));
CREATE UNIQUE INDEX addresses_load_balancer_member ON addresses (load_balancer_id, coalesce(lb_member, 'vip'))
    WHERE load_balancer_id IS NOT NULL AND status <> 'deleted';

-- A load balancer's addresses live and die with it: never deleted or assigned on their own
-- (the API answers 409 load_balancer_address). Only its final delete marks them deleted, in the
-- statement that releases them (straight to 'deleted', which this rule lets through).
CREATE FUNCTION addresses_load_balancer_rule() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.load_balancer_id IS NOT NULL
       AND (NEW.status IN ('deleting', 'destroying') OR NEW.server_id IS NOT NULL) THEN
        RAISE EXCEPTION 'address % belongs to load balancer %; it goes when the load balancer is deleted',
            OLD.id, OLD.load_balancer_id
            USING ERRCODE = 'check_violation', CONSTRAINT = 'addresses_load_balancer_address';
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER addresses_load_balancer_rule
    BEFORE UPDATE OF status, server_id ON addresses
    FOR EACH ROW
    WHEN (OLD.load_balancer_id IS NOT NULL)
    EXECUTE FUNCTION addresses_load_balancer_rule();
