-- The tenants table.

-- name: tenant_upsert
INSERT INTO tenants (id, name) VALUES ($1, $2)
ON CONFLICT (name) DO UPDATE SET name = EXCLUDED.name
RETURNING id, name;

-- name: tenant_name
SELECT name FROM tenants WHERE id = $1;

-- name: tenant_names
-- The names of the tenants $1 (ids; those that exist).
SELECT id, name FROM tenants WHERE id = ANY($1::text[]);
