"""Attacks on the simulator's issue-9 / issue-8 §3 endpoints (found by review): each test failed before
its fix. Through HTTPS as z9 calls it (proxmoxer, or raw requests where proxmoxer cannot say it)."""

from __future__ import annotations

import hashlib
import time

import pytest
import requests
from proxmoxer import ResourceException

from z9.common.nocloud import build_nocloud_iso

from .test_sim_guest import agent_exec, clone, err, until


def raw(sim, method: str, path: str, **kw) -> requests.Response:
    headers = {"Authorization": f"PVEAPIToken=root@pam!z9={sim.token_secret}", **kw.pop("headers", {})}
    return requests.request(method, f"https://127.0.0.1:{sim.port}/api2/json{path}", headers=headers,
                            verify=str(sim.cert_path), timeout=10, **kw)


def test_client_parameters_named_like_internal_values_are_refused(sim, pve, wait, admin):
    """'@corrupt' / '@file' are the simulator's own request-internal values: a client sending them gets
    PVE's unknown-parameter 400, and the uploaded bytes stay what was sent."""
    data = b"hello world"
    digest = hashlib.sha256(data).hexdigest()
    for kw in ({"params": {"@corrupt": "1"}}, {"data": {"content": "iso", "@corrupt": "1"}}):
        form = {"content": "iso", "checksum-algorithm": "sha256", "checksum": digest}
        form.update(kw.get("data", {}))
        r = raw(sim, "POST", "/nodes/pve1/storage/local/upload", params=kw.get("params"),
                files={"filename": ("a.iso", data)}, data=form)
        assert r.status_code == 400, r.text
        assert r.json()["errors"] == {"@corrupt": "property is not defined in schema and the schema does not "
                                                  "allow additional properties"}
    r = raw(sim, "GET", "/nodes/pve1/tasks", params={"@accept_encoding": "gzip"})
    assert r.status_code == 400 and "@accept_encoding" in r.json()["errors"]
    assert admin("get", "/state")["storage"] == {}
    # the ordinary upload still works and stores the bytes sent
    r = raw(sim, "POST", "/nodes/pve1/storage/local/upload", files={"filename": ("a.iso", data)},
            data={"content": "iso", "checksum-algorithm": "sha256", "checksum": digest})
    assert r.status_code == 200, r.text
    assert wait(r.json()["data"])["exitstatus"] == "OK"
    assert admin("get", "/state")["storage"]["local@pve1"][0]["sha256"] == digest
