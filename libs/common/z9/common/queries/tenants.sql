-- The tenants table.

-- name: tenant_upsert
INSERT INTO tenants (id, name) VALUES ($1, $2)
ON CONFLICT (name) DO UPDATE SET name = EXCLUDED.name
RETURNING id, name;

-- name: tenant_name
SELECT name FROM tenants WHERE id = $1;
