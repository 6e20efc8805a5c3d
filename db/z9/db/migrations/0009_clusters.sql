-- z9 schema, version 9: Kubernetes clusters (issue 11).
--
-- A cluster is one resource (k8s_…) owning N VMs (its members: cp-0…, <pool>-0…) and one address
-- (its control-plane endpoint, allocated in the API transaction, protected from deletion through
-- /v1/addresses and released by the cluster's delete). Deletion is immediate: DELETE moves it to
-- 'destroying' and enqueues ClusterDelete at once (no buffer, no cancel).
--
-- The desired shape (control_plane, node_pools) is what the API accepted; members is what the
-- last converge or observe saw ([{name, role, pool, vmid, node, address, power_state, ready}]).
-- initialized_at: the first time every desired member was a Ready node (kubeconfigs are minted
-- only from then on: 409 cluster_not_ready before).
--
-- cluster_keys holds the cluster's PKI (CA, etcd CA, front-proxy CA, service-account key pair),
-- encrypted with the installation key (AES-256-GCM, the cluster id as associated data). The
-- delete removes the row in the transaction that marks the cluster deleted; nothing else reads
-- keys back from a VM.

CREATE TYPE cluster_status AS ENUM ('creating', 'running', 'degraded', 'updating', 'deleting', 'destroying',
                                    'deleted', 'failed');

CREATE TABLE clusters (
    id                    text PRIMARY KEY CHECK (id ~ '^k8s_[0-9a-z]{26}$'),
    tenant_id             text NOT NULL REFERENCES tenants (id),
    region                text NOT NULL,
    name                  text NOT NULL CHECK (name ~ '^[a-z0-9][a-z0-9-]{0,62}$'),
    version               text NOT NULL,
    image                 text NOT NULL,
    control_plane         jsonb NOT NULL,
    node_pools            jsonb NOT NULL,
    endpoint_address_id   text REFERENCES addresses (id),
    endpoint_ip           inet,
    members               jsonb NOT NULL DEFAULT '[]',
    initialized_at        timestamptz,
    status                cluster_status NOT NULL DEFAULT 'creating',
    status_reason         text,
    status_before_delete  cluster_status,
    delete_after          timestamptz,
    observed_at           timestamptz,
    created_at            timestamptz NOT NULL DEFAULT now(),
    updated_at            timestamptz NOT NULL DEFAULT now(),
    deleted_at            timestamptz,
    CHECK (status <> 'deleting' OR delete_after IS NOT NULL),
    CHECK ((status = 'deleted') = (deleted_at IS NOT NULL))
);
CREATE UNIQUE INDEX clusters_tenant_name_live ON clusters (tenant_id, name) WHERE status <> 'deleted';
CREATE INDEX clusters_deletion_due ON clusters (delete_after) WHERE status = 'deleting';

CREATE TABLE cluster_keys (
    cluster_id  text PRIMARY KEY REFERENCES clusters (id),
    key_id      text NOT NULL,       -- which installation key sealed it (sha256 prefix)
    nonce       bytea NOT NULL CHECK (length(nonce) = 12),
    sealed      bytea NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- A live cluster's endpoint address is neither deleted nor assigned to a server through /v1/addresses,
-- protection or not (the API answers 409 cluster_endpoint): the cluster's delete releases it.
CREATE FUNCTION addresses_cluster_endpoint() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF ((NEW.status IN ('deleting', 'destroying') AND OLD.status NOT IN ('deleting', 'destroying'))
        OR (NEW.server_id IS NOT NULL AND NEW.server_id IS DISTINCT FROM OLD.server_id))
       AND EXISTS (SELECT 1 FROM clusters c WHERE c.endpoint_address_id = OLD.id AND c.status <> 'deleted') THEN
        RAISE EXCEPTION 'address % is the control-plane endpoint of a Kubernetes cluster: it is neither assigned '
                        'to a server nor deleted on its own (delete the cluster instead)', OLD.id
            USING ERRCODE = 'check_violation', CONSTRAINT = 'addresses_cluster_endpoint';
    END IF;
    RETURN NEW;
END;
$$;
CREATE TRIGGER addresses_cluster_endpoint
    BEFORE UPDATE OF status, server_id ON addresses
    FOR EACH ROW
    EXECUTE FUNCTION addresses_cluster_endpoint();
