"""The platform's Proxmox identity is hidden where z9 writes it (jobs' steps and errors), and a
tenant's own fields are never rewritten: no oracle, no changed data."""
from __future__ import annotations

import json

from z9.api.redaction import redact
from z9.common import store
from z9.common.settings import Settings
from z9.common.store import Lease

from tests.support import REGION, Stack

USERS = (b"root@pam!z9", b"root@pam")


def test_only_the_fields_z9_writes_from_proxmox_are_redacted() -> None:
    upid = "UPID:pve1:0000A1B2:0012C3D4:6756A1B2:qmclone:9000:root@pam!z9:"
    doc = {"job": {"steps": [{"detail": {"upid": upid}}], "error": {"message": "root@pam!z9 lacks VM.Allocate"}},
           "server": {"name": "root-pam", "labels": {"owner": "root@pam"}, "status_reason": "root@pam!z9 said no",
                      "ssh_keys": ["ssh-ed25519 AAAA root@pam!zz", "ssh-ed25519 AAAA root@pam"]}}
    out = json.loads(redact(json.dumps(doc).encode(), USERS))
    assert out["job"]["steps"][0]["detail"]["upid"].endswith(":qmclone:9000:hidden:")
    assert out["job"]["error"]["message"] == "hidden lacks VM.Allocate"
    assert out["server"]["status_reason"] == "hidden said no"
    assert out["server"]["labels"] == {"owner": "root@pam"}
    assert out["server"]["ssh_keys"] == doc["server"]["ssh_keys"]
    # within z9's own fields, whole names only: another account is not turned into an oracle
    other = {"job": {"error": {"message": "root@pam!zz is unknown"}}}
    assert json.loads(redact(json.dumps(other).encode(), USERS)) == other
    # the API's own error answer (about the request, which may echo what the tenant sent) is left alone
    answer = {"error": {"code": "invalid", "message": "name: 'root@pam!zz' is not a name", "details": None}}
    body = json.dumps(answer).encode()
    assert redact(body, USERS) is body


async def test_a_tenants_own_field_holding_root_at_pam_is_untouched(api: Stack, settings: Settings) -> None:
    blob = "AAAAC3NzaC1lZDI1NTE5AAAAIIMQ+ctuWvPKZcSiB0avvBJbVNptRfvJ+8krZNKKKLvo"  # a real key (ssh-keygen reads it)
    keys = [f"ssh-ed25519 {blob} root@pam!zz", f"ssh-ed25519 {blob} root@pam"]
    server, job = await api.create_server("own-1", ssh_keys=keys)
    got = await api.server(server["id"])
    assert got["ssh_keys"] == keys  # as sent: not `hidden!zz`, not `hidden`
    status, listed = await api.call("GET", "/servers")
    assert status == 200 and [s["ssh_keys"] for s in listed["servers"] if s["id"] == server["id"]] == [keys]
    # while the platform account in the job's steps is still hidden
    claimed = await store.job_claim(api.pool, [REGION], 10, "owner-x", 30)
    lease = Lease(job["id"], "owner-x", claimed[0].attempt)
    account = settings.regions[REGION].token_id
    await store.job_progress(api.pool, lease, [{"name": "clone", "state": "running", "detail": {
        "upid": f"UPID:pve1:0000A1B2:0012C3D4:6756A1B2:qmclone:9000:{account}:", "note": f"by {account}"}}], 30)
    view = await api.job(job["id"])
    assert account not in json.dumps(view)
    assert view["steps"][0]["detail"]["note"] == "by hidden"
