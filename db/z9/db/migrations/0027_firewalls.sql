-- z9 schema, version 27: firewalls — a tenant's rule sets (Hetzner Cloud's shape) that z9 compiles into
-- the VM firewall of each server they apply to.
--
-- A firewall keeps the lifecycle columns of every resource table (migration 0004) and its own: rules (the
-- tenant's list, jsonb: direction, protocol, port, source_ips/destination_ips, description, and
-- source_firewalls/destination_firewalls naming "members of firewall X"), applied_to (what the tenant
-- asked for: servers by id, label selectors by text) and generation (bumped by every change of rules or
-- membership: a member is applied at a generation).
--
-- Status: creating → active; destroying (the final job: deleted at once, never while applied) → deleted;
-- failed.
--
-- firewall_members is the membership as resolved: one row per (firewall, server), ``via`` the entry of
-- applied_to that put it there (a server id directly, or a label selector: never both — the API refuses
-- a second path with 409 firewall_managed_by_label_selector / firewall_already_applied), ``state``
-- pending (written or to be written, not yet seen enforced), applied (a job saw its rules on the VM one
-- pve-firewall cycle after writing them), removing (to be taken off the server's VM; the row goes when
-- that is done).
CREATE TYPE firewall_status AS ENUM ('creating', 'active', 'deleting', 'destroying', 'deleted', 'failed');

CREATE TABLE firewalls (
    id                    text PRIMARY KEY CHECK (id ~ '^fw_[0-9a-z]{26}$'),
    tenant_id             text NOT NULL REFERENCES tenants (id),
    region                text NOT NULL,
    name                  text NOT NULL CHECK (name ~ '^[a-z0-9][a-z0-9-]{0,62}$'),
    rules                 jsonb NOT NULL DEFAULT '[]' CHECK (jsonb_typeof(rules) = 'array' AND jsonb_array_length(rules) <= 50),
    applied_to            jsonb NOT NULL DEFAULT '[]' CHECK (jsonb_typeof(applied_to) = 'array'),
    generation            bigint NOT NULL DEFAULT 1 CHECK (generation >= 1),
    labels                jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(labels) = 'object'),
    status                firewall_status NOT NULL DEFAULT 'creating',
    status_reason         text,
    status_before_delete  firewall_status,
    delete_after          timestamptz,
    observed              jsonb,
    observed_at           timestamptz,
    created_at            timestamptz NOT NULL DEFAULT now(),
    updated_at            timestamptz NOT NULL DEFAULT now(),
    deleted_at            timestamptz,
    CHECK (status <> 'deleting' OR delete_after IS NOT NULL),
    CHECK ((status = 'deleted') = (deleted_at IS NOT NULL))
);

CREATE UNIQUE INDEX firewalls_tenant_name_live ON firewalls (tenant_id, name) WHERE status <> 'deleted';
CREATE INDEX firewalls_tenant_id ON firewalls (tenant_id, id);
CREATE INDEX firewalls_deletion_due ON firewalls (delete_after) WHERE status = 'deleting';

CREATE TYPE firewall_member_state AS ENUM ('pending', 'applied', 'removing');

CREATE TABLE firewall_members (
    firewall_id   text NOT NULL REFERENCES firewalls (id),
    server_id     text NOT NULL REFERENCES servers (id),
    via           text NOT NULL CHECK (via IN ('server', 'label_selector')),
    state         firewall_member_state NOT NULL DEFAULT 'pending',
    generation    bigint,                 -- the firewall's generation last seen applied on the VM
    enforced      boolean,                -- the datacenter firewall, the VM's and its NIC's switches on (NULL: not seen)
    detail        text,                   -- what the last check saw when not applied
    applied_at    timestamptz,
    updated_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (firewall_id, server_id)
);

CREATE INDEX firewall_members_server ON firewall_members (server_id);
