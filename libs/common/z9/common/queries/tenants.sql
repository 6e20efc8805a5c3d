-- The tenants table.

-- name: tenant_upsert
INSERT INTO tenants (id, name) VALUES ($1, $2)
ON CONFLICT (name) DO UPDATE SET name = EXCLUDED.name
RETURNING id, name;

-- name: tenant_name
SELECT name FROM tenants WHERE id = $1;

-- name: tenant_id_by_name
-- The id of the tenant named $1 (names are unique), none when there is none.
SELECT id FROM tenants WHERE name = $1;

-- name: tenant_names
-- The names of the tenants $1 (ids; those that exist).
SELECT id, name FROM tenants WHERE id = ANY($1::text[]);
