-- The vm_clone_requests table: clone requests sent to Proxmox VE, so a lost answer is found again.

-- ================================================================ VM clone requests

-- name: vm_clone_sent
-- Before the clone POST (fenced by the sender's lease): the request may be performed from now.
INSERT INTO vm_clone_requests (resource_id, member, vmid, node, job_id)
SELECT $4, $5, $6, $7, j.id FROM jobs j
WHERE j.id = $1 AND j.lease_owner = $2 AND j.attempt = $3 AND j.status::text = 'running'
ON CONFLICT (resource_id, member, vmid) DO UPDATE
SET node = EXCLUDED.node, job_id = EXCLUDED.job_id, sent_at = now(), lost_at = NULL, answered_at = NULL,
    upid = NULL
RETURNING vmid;

-- name: vm_clone_answered
-- The hypervisor answered with the clone task's UPID.
UPDATE vm_clone_requests SET answered_at = now(), upid = $4
WHERE resource_id = $1 AND member = $2 AND vmid = $3
RETURNING vmid;

-- name: vm_clone_lost
-- The sender saw the answer lost (timeout, connection dropped): the request was in flight until
-- now, and may still be performed.
UPDATE vm_clone_requests SET lost_at = now()
WHERE resource_id = $1 AND member = $2 AND vmid = $3 AND answered_at IS NULL
RETURNING vmid;

-- name: vm_clone_refused
-- The hypervisor refused the vmid (taken): nothing was cloned; the request is forgotten.
DELETE FROM vm_clone_requests WHERE resource_id = $1 AND member = $2 AND vmid = $3;

-- name: vm_clone_requests
-- The clone requests of one resource (every member, or one); uncertain_since, while no answer was
-- recorded, is when it was last known in flight (lost_at, else sent_at).
SELECT member, vmid, node, job_id, upid, extract(epoch FROM sent_at)::float8 AS sent_at,
       CASE WHEN answered_at IS NULL THEN extract(epoch FROM coalesce(lost_at, sent_at))::float8 END
           AS uncertain_since
FROM vm_clone_requests
WHERE resource_id = $1 AND ($2::text IS NULL OR member = $2)
ORDER BY member, sent_at, vmid;
