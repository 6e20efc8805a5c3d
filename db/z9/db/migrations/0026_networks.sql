-- z9 schema, version 26: private networks — one Proxmox SDN VNet per network, in the SDN zone z9
-- keeps per region — their members (a server's NIC on the VNet, with the address z9 gave it), and
-- each region's SDN apply: the one apply job it waits for, the lock token z9 holds, and why an apply
-- is blocked (the region's condition).
--
-- A network keeps the lifecycle columns of every resource table (migration 0004) and its own:
-- ip_range (an RFC 1918 IPv4 network, /16 to /28; two tenants — or two networks of one — may use the
-- same: z9 keeps the addressing itself, PVE is given no subnet), vni (the VNet's VXLAN id or VLAN tag,
-- unique among the region's networks not yet deleted: network_vni_live) and vnet (the VNet's id, at
-- most 8 characters — pve-network VnetPlugin.pm — minted by z9 from the vni: unique with it).
--
-- Status: creating → available (the VNet in the running config, every node's zone available);
-- deleting (the buffer) → destroying (the VNet goes at the next apply) → deleted; failed.
CREATE TYPE network_status AS ENUM ('creating', 'available', 'deleting', 'destroying', 'deleted', 'failed');

CREATE TABLE networks (
    id                    text PRIMARY KEY CHECK (id ~ '^net_[0-9a-z]{26}$'),
    tenant_id             text NOT NULL REFERENCES tenants (id),
    region                text NOT NULL,
    name                  text NOT NULL CHECK (name ~ '^[a-z0-9][a-z0-9-]{0,62}$'),
    ip_range              cidr NOT NULL CHECK (family(ip_range) = 4 AND masklen(ip_range) BETWEEN 16 AND 28
                                               AND (ip_range <<= '10.0.0.0/8' OR ip_range <<= '172.16.0.0/12'
                                                    OR ip_range <<= '192.168.0.0/16')),
    vni                   integer NOT NULL CHECK (vni BETWEEN 1 AND 16777215),
    vnet                  text NOT NULL CHECK (vnet ~ '^[a-z][a-z0-9]{0,6}[a-z0-9]$'),
    labels                jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(labels) = 'object'),
    status                network_status NOT NULL DEFAULT 'creating',
    status_reason         text,
    status_before_delete  network_status,
    delete_after          timestamptz,
    observed              jsonb,
    observed_at           timestamptz,
    created_at            timestamptz NOT NULL DEFAULT now(),
    updated_at            timestamptz NOT NULL DEFAULT now(),
    deleted_at            timestamptz,
    CHECK (status <> 'deleting' OR delete_after IS NOT NULL),
    CHECK ((status = 'deleted') = (deleted_at IS NOT NULL))
);

CREATE UNIQUE INDEX networks_tenant_name_live ON networks (tenant_id, name) WHERE status <> 'deleted';
-- a VXLAN id (VLAN tag) is one network's in its region until that network is deleted for good (its
-- VNet gone from the running config): pve-network refuses a VNI twice across every VXLAN zone
CREATE UNIQUE INDEX network_vni_live ON networks (region, vni) WHERE status <> 'deleted';
CREATE UNIQUE INDEX network_vnet_live ON networks (region, vnet) WHERE status <> 'deleted';
CREATE INDEX networks_tenant_id ON networks (tenant_id, id);
CREATE INDEX networks_deletion_due ON networks (delete_after) WHERE status = 'deleting';

-- A member: a server on a network, by its NIC (net1…net31: net0 is the server's own) and the address
-- z9 gave it there (unique in the network: ip_not_available; every address of the range but its
-- network and broadcast addresses may be given). The row stays until the detach job has taken the NIC
-- off the VM: its address is not given again before (the order Hetzner's #586 lacked).
CREATE TABLE network_members (
    network_id  text NOT NULL REFERENCES networks (id),
    server_id   text NOT NULL REFERENCES servers (id),
    tenant_id   text NOT NULL REFERENCES tenants (id),
    ip          inet NOT NULL CHECK (family(ip) = 4 AND masklen(ip) = 32),
    nic         text NOT NULL CHECK (nic ~ '^net([1-9]|[12][0-9]|3[01])$'),
    state       text NOT NULL DEFAULT 'attaching' CHECK (state IN ('attaching', 'attached', 'detaching')),
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (network_id, server_id)
);
CREATE UNIQUE INDEX network_members_ip ON network_members (network_id, ip);
CREATE UNIQUE INDEX network_members_nic ON network_members (server_id, nic);

-- A region's SDN apply (one row per region that has networks): the apply job its next network edit
-- waits for (apply_job_id: pending, not yet started; NULL: the next edit enqueues one — the job
-- clears it as it starts, under this row's lock, so an edit is either seen by a running apply or
-- enqueues the next), the PVE 9 SDN lock token z9 holds (lock_token, taken by lock_job_id at
-- lock_taken_at: recorded before it is used, so a job after an executor died holding it releases
-- exactly this token and never one z9 did not mint), and what blocks the apply (condition: foreign
-- pending edits, a foreign lock, a node that failed to reload — null when nothing does).
CREATE TABLE sdn_regions (
    region         text PRIMARY KEY,
    apply_job_id   text,
    lock_token     text,
    lock_job_id    text,
    lock_taken_at  timestamptz,
    condition      jsonb CHECK (condition IS NULL OR jsonb_typeof(condition) = 'object'),
    applies        bigint NOT NULL DEFAULT 0,
    applied_at     timestamptz,
    updated_at     timestamptz NOT NULL DEFAULT now(),
    CHECK ((lock_token IS NULL) = (lock_job_id IS NULL))
);
