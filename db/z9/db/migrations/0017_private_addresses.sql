-- z9 schema, version 17: every guest's address known to z9, so its Proxmox IP filter can hold it;
-- and a quota of load balancers.
--
-- A guest without an address of its own from a pool (a server without a primary address, a
-- Kubernetes cluster's members) used to take DHCP from the bridge: z9 could not know its lease, so
-- its IP filter stayed off and the guest could claim any address on the bridge. With a region's
-- private_network set, z9 chooses each such VM's address itself — one row per (resource, member),
-- taken by the VM's job before the VM's first start and written as its static cloud-init network
-- and as the only address in its ipfilter-net0 — and releases it when the VM is gone (the member
-- removed, the resource deleted). A released IP is kept from reuse until reusable_after (the
-- network's quarantine_s, copied at allocation), keyed by (region, ip) whatever the network's
-- settings become. Two live rows of a region never share an IP; a member has one live row.

CREATE TABLE vm_private_addresses (
    resource_id     text NOT NULL,
    member          text NOT NULL,
    region          text NOT NULL,
    ip              inet NOT NULL CHECK (family(ip) = 4 AND masklen(ip) = 32),
    quarantine_s    integer NOT NULL CHECK (quarantine_s >= 0),
    allocated_at    timestamptz NOT NULL DEFAULT now(),
    released_at     timestamptz,
    reusable_after  timestamptz,
    CHECK ((released_at IS NULL) = (reusable_after IS NULL))
);
CREATE UNIQUE INDEX vm_private_addresses_member_live ON vm_private_addresses (resource_id, member)
    WHERE released_at IS NULL;
CREATE UNIQUE INDEX vm_private_addresses_ip_live ON vm_private_addresses (region, ip) WHERE released_at IS NULL;
CREATE INDEX vm_private_addresses_quarantined ON vm_private_addresses (region, ip) INCLUDE (reusable_after)
    WHERE released_at IS NOT NULL;

-- A quota of load balancers per tenant (NULL: Z9_QUOTA_LOAD_BALANCERS): each one is up to three
-- addresses but also two VMs and their health checks on the shared hypervisor, which the address
-- quota alone did not bound.
ALTER TABLE tenant_quotas ADD COLUMN load_balancers integer CHECK (load_balancers >= 0);
