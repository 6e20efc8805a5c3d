-- z9 schema, version 18: volumes — block storage a tenant creates in a region, attaches to at most
-- one server of that region at a time, grows online and deletes in two phases.
--
-- A volume keeps the lifecycle columns of every resource table (migration 0004) and its own:
-- size_gib (grow only: the API refuses less, the table too), storage (the region's volume storage,
-- copied at create: the disk stays where it was made), server_id (the server it is meant to be on:
-- the intent, set by the request; NULL: detached) and what the last job saw (observed: the VM that
-- holds the disk, found by the drive's serial — never by a disk slot —, its key, size and anchor).
--
-- Status: creating → available (its disk on its own anchor VM) ⇄ attached (on the server's VM);
-- deleting (detached during the buffer) → destroying → deleted; failed.
--
-- What a deletion means the table keeps itself (as addresses do): it takes the volume off its
-- server (the buffer's VolumeDetach makes that true in the world) and remembers the server; a
-- cancellation gives it back (the restoring VolumeAttach puts it on again), unless that server has
-- gone meanwhile.
CREATE TYPE volume_status AS ENUM ('creating', 'available', 'attached', 'deleting', 'destroying', 'deleted', 'failed');

CREATE TABLE volumes (
    id                    text PRIMARY KEY CHECK (id ~ '^vol_[0-9a-z]{26}$'),
    tenant_id             text NOT NULL REFERENCES tenants (id),
    region                text NOT NULL,
    name                  text NOT NULL CHECK (name ~ '^[a-z0-9][a-z0-9-]{0,62}$'),
    size_gib              integer NOT NULL CHECK (size_gib BETWEEN 1 AND 65536),
    storage               text NOT NULL CHECK (length(storage) BETWEEN 1 AND 63),
    server_id             text REFERENCES servers (id),
    labels                jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(labels) = 'object'),
    status                volume_status NOT NULL DEFAULT 'creating',
    status_reason         text,
    status_before_delete  volume_status,
    server_before_delete  text REFERENCES servers (id),
    delete_after          timestamptz,
    observed              jsonb,
    observed_at           timestamptz,
    created_at            timestamptz NOT NULL DEFAULT now(),
    updated_at            timestamptz NOT NULL DEFAULT now(),
    deleted_at            timestamptz,
    CHECK (status <> 'deleting' OR delete_after IS NOT NULL),
    CHECK ((status = 'deleted') = (deleted_at IS NOT NULL)),
    CHECK (status NOT IN ('deleting', 'destroying', 'deleted') OR server_id IS NULL)
);

CREATE UNIQUE INDEX volumes_tenant_name_live ON volumes (tenant_id, name) WHERE status <> 'deleted';
CREATE INDEX volumes_tenant_id ON volumes (tenant_id, id);
CREATE INDEX volumes_server ON volumes (server_id) WHERE server_id IS NOT NULL;
CREATE INDEX volumes_deletion_due ON volumes (delete_after) WHERE status = 'deleting';

-- grow only: a size never goes down (the API answers 422 first; this is the last line)
CREATE FUNCTION volumes_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.size_gib < OLD.size_gib THEN
        RAISE EXCEPTION 'volume % is % GiB; volumes never shrink', OLD.id, OLD.size_gib
            USING ERRCODE = 'check_violation', CONSTRAINT = 'volumes_never_shrink';
    END IF;
    IF NEW.status IN ('deleting', 'destroying') AND OLD.status NOT IN ('deleting', 'destroying') THEN
        NEW.server_before_delete := OLD.server_id;
        NEW.server_id := NULL;
    ELSIF OLD.status = 'deleting' AND NEW.status NOT IN ('deleting', 'destroying', 'deleted') THEN
        NEW.server_id := (SELECT s.id FROM servers s WHERE s.id = OLD.server_before_delete
                          AND s.status NOT IN ('deleting', 'destroying', 'deleted'));
        NEW.status := CASE WHEN NEW.server_id IS NULL AND NEW.status = 'attached' THEN 'available'
                           ELSE NEW.status END;
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER volumes_guard
    BEFORE UPDATE OF status, size_gib ON volumes
    FOR EACH ROW
    EXECUTE FUNCTION volumes_guard();

-- the volume_gib quota: a tenant's live volumes' sizes (NULL: the Z9_QUOTA_VOLUME_GIB default)
ALTER TABLE tenant_quotas ADD COLUMN volume_gib bigint CHECK (volume_gib >= 0);
