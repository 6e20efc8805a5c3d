"""Kubeconfigs are cluster-admin credentials: minting one needs the write scope, its expiry is
capped (installation setting, and the minting token's own expiry), every one is recorded
(``GET /v1/clusters/{id}/credentials``), and ``rotate-credentials`` makes every one minted before
stop working — measured in the simulated API server, which authenticates a client certificate
against its ``--client-ca-file`` as it is now."""
from __future__ import annotations

import base64
from datetime import datetime, timedelta, timezone
from typing import Any

import aiohttp
import yaml
from cryptography import x509

from z9.common import pki, store

from tests.support import REGION, SimAdmin, Stack, make_tenant, wait_until
from tests.integration.clusters.test_clusters_e2e import K8S_TIMING, cluster
from tests.integration.security.test_tokens import call
from z9.resources.cluster import store as cluster_store

BODY = {"name": "kc", "region": REGION, "version": "1.33",
        "control_plane": {"count": 1, "cores": 2, "memory_mib": 2048, "disk_gib": 10}, "node_pools": []}


async def _ready_cluster(api: Stack) -> str:
    """A cluster row that was ready once (the API alone: no executor)."""
    status, out = await api.call("POST", "/clusters", json=BODY)
    assert status == 202, out
    cid = out["cluster"]["id"]
    await api.pool.execute("UPDATE clusters SET status = 'running', initialized_at = now() WHERE id = $1", cid)
    return cid


async def test_a_read_token_cannot_mint_a_kubeconfig(api: Stack) -> None:
    cid = await _ready_cluster(api)
    status, out = await api.call("POST", "/tokens", json={"name": "ro", "scopes": ["read"]})
    assert status == 201, out
    status, out, _ = await call(api, "GET", f"/clusters/{cid}/kubeconfig", out["secret"])
    assert status == 403 and out["error"]["code"] == "insufficient_scope", out
    assert await api.pool.fetchval("SELECT count(*) FROM cluster_credentials") == 0


async def test_expiry_is_capped_and_every_kubeconfig_recorded(api: Stack) -> None:
    cid = await _ready_cluster(api)
    status, out = await api.call("GET", f"/clusters/{cid}/kubeconfig", params={"expiry_s": "31536000"})
    assert status == 422 and out["error"]["details"][0]["field"] == "expiry_s", out
    assert "Z9_KUBECONFIG_MAX_EXPIRY_S" in out["error"]["message"], out
    status, out = await api.call("GET", f"/clusters/{cid}/kubeconfig", params={"expiry_s": "86401"})
    assert status == 422 and out["error"]["details"][0]["field"] == "expiry_s", out
    status, kc = await api.call("GET", f"/clusters/{cid}/kubeconfig", params={"expiry_s": "86400"})
    assert status == 200, kc
    # a token expiring in 10 minutes mints certificates that expire with it
    status, out = await api.call("POST", "/tokens", json={"name": "short", "expires_in_s": 600})
    short = out["secret"]
    status, kc2, _ = await call(api, "GET", f"/clusters/{cid}/kubeconfig?expiry_s=3600", short)
    assert status == 200, kc2
    crt = x509.load_pem_x509_certificate(base64.b64decode(
        yaml.safe_load(kc2["kubeconfig"])["users"][0]["user"]["client-certificate-data"]))
    token_exp = datetime.fromisoformat(out["token"]["expires_at"])
    assert abs((crt.not_valid_after_utc - token_exp).total_seconds()) <= 2
    # the audit record: who, when, until when, serial — listed to the tenant, newest first
    status, listed = await api.call("GET", f"/clusters/{cid}/credentials")
    assert status == 200, listed
    got = listed["credentials"]
    assert [c["serial"] for c in got] == [kc2["serial"], kc["serial"]]
    assert got[0]["token_id"] == out["token"]["id"] and got[1]["token_id"] == (await store.api_token_auth(
        api.pool, api.token))["id"]
    assert got[0]["serial"] == format(crt.serial_number, "x") and got[0]["user"] == kc2["user"]
    assert all(c["trusted"] for c in got)
    # another tenant sees none of it
    _, other = await make_tenant(api.pool, "other")
    assert (await call(api, "GET", f"/clusters/{cid}/credentials", other))[0] == 404
    # rotation: every earlier one is no longer trusted, later ones are
    status, out = await api.call("POST", f"/clusters/{cid}/actions/rotate-credentials", json={})
    assert status == 202 and out["job"]["kind"] == "ClusterReconcile", out
    status, kc3 = await api.call("GET", f"/clusters/{cid}/kubeconfig")
    status, listed = await api.call("GET", f"/clusters/{cid}/credentials")
    assert [(c["serial"], c["trusted"]) for c in listed["credentials"]] == [
        (kc3["serial"], True), (kc2["serial"], False), (kc["serial"], False)]


async def test_rotation_of_a_cluster_without_a_client_ca_is_refused(api: Stack) -> None:
    """A cluster made before kubeconfigs had a CA of their own: its certificates are the cluster
    CA's, which a rotation cannot take back without replacing the whole PKI: 409, not a lie."""
    cid = await _ready_cluster(api)
    key = pki.InstallationKey.parse(api.settings.installation_key.get_secret_value())
    material = key.open(cid, *await cluster_store.cluster_keys_get(api.pool, cid))
    material.pop("client-ca.crt"), material.pop("client-ca.key")
    await api.pool.execute("UPDATE cluster_keys SET key_id = $2, nonce = $3, sealed = $4 WHERE cluster_id = $1",
                           cid, *key.seal(cid, material))
    status, out = await api.call("POST", f"/clusters/{cid}/actions/rotate-credentials", json={})
    assert status == 409 and out["error"]["code"] == "client_ca_unsupported", out
    status, kc = await api.call("GET", f"/clusters/{cid}/kubeconfig")
    assert status == 200, kc                                      # still minted, by the cluster CA


async def _kubectl(sim: SimAdmin, node: str, vmid: int, kubeconfig: str) -> tuple[int, str]:
    """``kubectl --kubeconfig <it> get --raw /readyz`` inside the guest, through the guest agent."""
    srv = sim.server
    agent = f"{srv.url}/api2/json/nodes/{node}/qemu/{vmid}/agent"
    async with aiohttp.ClientSession(headers={"Authorization": f"PVEAPIToken={srv.token_id}={srv.token_secret}"}) as h:
        async with h.post(f"{agent}/file-write", data={"file": "/root/user.kubeconfig", "content": kubeconfig},
                          ssl=False) as r:
            assert r.status == 200, await r.text()
        async with h.post(f"{agent}/exec", data=[("command", c) for c in (
                "kubectl", "--kubeconfig", "/root/user.kubeconfig", "get", "--raw", "/readyz")], ssl=False) as r:
            assert r.status == 200, await r.text()
            pid = (await r.json())["data"]["pid"]
        async def exited() -> dict | None:
            async with h.get(f"{agent}/exec-status", params={"pid": str(pid)}, ssl=False) as r:
                st = (await r.json())["data"]
            return st if st.get("exited") else None
        st = await wait_until(exited, 20, "kubectl to finish")
        return int(st.get("exitcode", -1)), str(st.get("out-data", "")) + str(st.get("err-data", ""))


async def test_a_rotated_cluster_refuses_a_certificate_minted_before(stack: Stack, sim: SimAdmin) -> None:
    await sim.configure(**K8S_TIMING)
    status, out = await stack.call("POST", "/clusters", json=BODY)
    assert status == 202, out
    cid = out["cluster"]["id"]
    assert (await stack.wait_job(out["job"]["id"], timeout_s=120))["status"] == "succeeded"
    cp = next(m for m in (await cluster(stack, cid))["members"] if m["name"] == "cp-0")
    status, old = await stack.call("GET", f"/clusters/{cid}/kubeconfig?expiry_s=600")
    assert status == 200, old
    assert await _kubectl(sim, cp["node"], cp["vmid"], old["kubeconfig"]) == (0, "ok")
    # a certificate of another CA is refused (the model checks, it does not just say ok)
    forged_ca, forged_key = pki.new_client_ca()
    crt, k, _ = pki.client_certificate(forged_ca, forged_key, cn="mallory", orgs=("kubeadm:cluster-admins",),
                                       expiry_s=600)
    forged = pki.kubeconfig("kc", "https://x:6443", forged_ca, crt, k, "mallory")
    code, text = await _kubectl(sim, cp["node"], cp["vmid"], forged)
    assert code == 1 and "Unauthorized" in text, text

    before_crt = await _file(sim, cp["node"], cp["vmid"], pki.CLIENT_CA_CRT)
    assert before_crt == (await _material(stack, cid))["client-ca.crt"]   # written at bootstrap
    status, out = await stack.call("POST", f"/clusters/{cid}/actions/rotate-credentials", json={})
    assert status == 202, out
    done = await stack.wait_job(out["job"]["id"], timeout_s=120)
    assert done["status"] == "succeeded", done
    assert "push_client_ca" in [s["name"] for s in done["steps"]], done["steps"]
    code, text = await _kubectl(sim, cp["node"], cp["vmid"], old["kubeconfig"])
    assert code == 1 and "Unauthorized" in text, text
    status, new = await stack.call("GET", f"/clusters/{cid}/kubeconfig?expiry_s=600")
    assert await _kubectl(sim, cp["node"], cp["vmid"], new["kubeconfig"]) == (0, "ok")
    listed = (await stack.call("GET", f"/clusters/{cid}/credentials"))[1]["credentials"]
    assert [(c["serial"], c["trusted"]) for c in listed] == [(new["serial"], True), (old["serial"], False)]
    # the CSR API's kube-apiserver-client signer (kube-controller-manager) signs with the users'
    # client CA, whose files the rotation replaced too: a certificate got through a CSR before is
    # refused like the kubeconfig (its CA left the bundle), and the one after is the new CA's
    material = await _material(stack, cid)
    assert await _file(sim, cp["node"], cp["vmid"], pki.CLIENT_CA_CRT) == material["client-ca.crt"]
    assert await _file(sim, cp["node"], cp["vmid"], pki.CLIENT_CA_KEY) == material["client-ca.key"]
    assert material["client-ca.crt"] not in before_crt
    [model] = [c for c in (await sim._req("GET", "/k8s/clusters")).values() if c["init_vmid"] == cp["vmid"]]
    assert model["controller_manager_error"] is None, model
    assert model["csr_signers"]["kubernetes.io/kube-apiserver-client"] == [pki.CLIENT_CA_CRT, pki.CLIENT_CA_KEY]
    assert model["csr_signing_duration_s"] == stack.settings.kubeconfig_max_expiry_s


async def _material(stack: Stack, cid: str) -> dict[str, str]:
    sealed = await cluster_store.cluster_keys_get(stack.pool, cid)
    assert sealed is not None
    return pki.InstallationKey.parse(stack.settings.installation_key.get_secret_value()).open(cid, *sealed)


async def _file(sim: SimAdmin, node: str, vmid: int, path: str) -> str | None:
    """A file of the guest, read through the guest agent."""
    srv = sim.server
    async with aiohttp.ClientSession(headers={"Authorization": f"PVEAPIToken={srv.token_id}={srv.token_secret}"}) as h:
        async with h.get(f"{srv.url}/api2/json/nodes/{node}/qemu/{vmid}/agent/file-read", params={"file": path},
                         ssl=False) as r:
            if r.status != 200:
                return None
            return (await r.json())["data"]["content"]


def test_a_rotation_pushes_to_stale_api_servers_and_waits_for_a_stopped_one() -> None:
    """Plan (pure): the control planes whose bundle is not the new one get push_client_ca; one not
    running would come back trusting the old CA, so the rotation is not done (a temporary error)."""
    import pytest

    from z9.common.errors import TemporaryError
    from z9.common.models import Job
    from z9.resources.cluster.jobs import shared as _cluster

    from tests.unit.test_cluster_units import _cluster_row, _vm

    c = _cluster_row(control_plane={"count": 3}, node_pools=[])
    ready = {"cp-0": True, "cp-1": True, "cp-2": True}
    world = _cluster.World(cluster=c, desired=_cluster.desired_members(c), nodes=ready,
                           vms={m: _vm(100 + i, m) for i, m in enumerate(ready)}, client_ca_bundle="pem",
                           client_ca_stale=["cp-0", "cp-2"])
    assert [(s.name, s.detail) for s in _cluster.plan(Job.__new__(Job), world)] == [
        ("push_client_ca", {"members": ["cp-0", "cp-2"]})]
    world.client_ca_unreachable = ["cp-1"]
    with pytest.raises(TemporaryError, match="cp-1 is not running"):
        _cluster.plan(Job.__new__(Job), world)


def test_the_csr_api_signs_users_certificates_with_the_rotatable_client_ca() -> None:
    """kube-controller-manager's signers, as the kubeadm config z9 writes sets them (both config
    formats), read by the simulator's model of kube-controller-manager's flag rules: the
    kube-apiserver-client signer is the users' client CA (on every control plane, the key 0600;
    on no worker), the kubelets' signers stay the cluster CA, the flags are valid together (the
    single pair emptied), and no signer gives more than the kubeconfig cap. kubeadm's defaults
    alone would sign users' certificates with the cluster CA for a year."""
    from z9.resources.cluster.jobs import shared as _cluster
    from z9.sim.kubeadm import controller_manager_signers

    from tests.unit.test_cluster_units import _cluster_row

    default = controller_manager_signers({})
    assert default["csr_signers"]["kubernetes.io/kube-apiserver-client"] == [
        "/etc/kubernetes/pki/ca.crt", "/etc/kubernetes/pki/ca.key"] and default["csr_signing_duration_s"] == 365 * 86400
    material = pki.new_cluster_pki()
    for version, shape in (("1.30", dict), ("1.33", list)):
        c = _cluster_row(version=version, control_plane={"count": 1}, node_pools=[{"name": "w", "count": 1}])
        cp, worker = _cluster.desired_members(c)
        user = yaml.safe_load(_cluster.bootstrap_files(c, material, cp, None, signing_duration_s=86400)["user-data"])
        files = {f["path"]: f for f in user["write_files"]}
        assert files[pki.CLIENT_CA_KEY]["content"] == material["client-ca.key"]
        assert files[pki.CLIENT_CA_KEY]["permissions"] == "0600"
        assert files[pki.CLIENT_CA_CRT]["content"] == material["client-ca.crt"]
        docs = list(yaml.safe_load_all(files["/etc/z9/kubeadm.yaml"]["content"]))
        [cc] = [d for d in docs if d["kind"] == "ClusterConfiguration"]
        extra = cc["controllerManager"]["extraArgs"]
        assert isinstance(extra, shape), (version, extra)
        args = extra if isinstance(extra, dict) else {a["name"]: a["value"] for a in extra}
        model = controller_manager_signers(args)
        assert model["controller_manager_error"] is None, model
        assert model["csr_signers"] == {
            "kubernetes.io/kube-apiserver-client": [pki.CLIENT_CA_CRT, pki.CLIENT_CA_KEY],
            **{s: ["/etc/kubernetes/pki/ca.crt", "/etc/kubernetes/pki/ca.key"] for s in (
                "kubernetes.io/kube-apiserver-client-kubelet", "kubernetes.io/kubelet-serving",
                "kubernetes.io/legacy-unknown")}}, model
        assert model["csr_signing_duration_s"] == 86400
        joined = _cluster.bootstrap_files(c, material, worker, pki.new_bootstrap_token())["user-data"]
        assert "client-ca" not in joined and material["client-ca.key"] not in joined
    # the model refuses what kube-controller-manager refuses: the single pair beside a per-signer one
    bad = controller_manager_signers({"cluster-signing-kube-apiserver-client-cert-file": pki.CLIENT_CA_CRT,
                                      "cluster-signing-kube-apiserver-client-key-file": pki.CLIENT_CA_KEY})
    assert "at the same time" in (bad["controller_manager_error"] or ""), bad


# A minted kubeconfig's client certificate is one a strict verifier takes: OpenSSL's -x509_strict
# (RFC 5280 profile checks: a certificate not self-issued needs an Authority Key Identifier —
# error 85 "Missing Authority Key Identifier" —, a CA a Subject Key Identifier), issued by the CA
# the kubeconfig carries as the users' client CA; the answer's expires_at is the certificate's
# notAfter exactly (a certificate has whole seconds), as is the credential record's.
async def test_a_minted_kubeconfig_certificate_is_x509_strict_and_expires_when_it_says(api: Stack, tmp_path) -> None:
    import subprocess

    cid = await _ready_cluster(api)
    status, kc = await api.call("GET", f"/clusters/{cid}/kubeconfig", params={"expiry_s": "3600"})
    assert status == 200, kc
    pem = base64.b64decode(yaml.safe_load(kc["kubeconfig"])["users"][0]["user"]["client-certificate-data"])
    crt = x509.load_pem_x509_certificate(pem)
    key = pki.InstallationKey.parse(api.settings.installation_key.get_secret_value())
    material = key.open(cid, *await cluster_store.cluster_keys_get(api.pool, cid))
    (tmp_path / "ca.crt").write_text(material["client-ca.crt"])
    (tmp_path / "user.crt").write_bytes(pem)
    r = subprocess.run(["openssl", "verify", "-x509_strict", "-purpose", "sslclient", "-CAfile",
                        str(tmp_path / "ca.crt"), str(tmp_path / "user.crt")], capture_output=True, text=True,
                       check=False)
    assert r.returncode == 0 and r.stdout.strip().endswith(": OK"), (r.stdout, r.stderr)
    ski = x509.load_pem_x509_certificate(material["client-ca.crt"].encode()).extensions.get_extension_for_class(
        x509.SubjectKeyIdentifier).value
    aki = crt.extensions.get_extension_for_class(x509.AuthorityKeyIdentifier).value
    assert aki.key_identifier == ski.digest
    assert crt.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value == \
        x509.SubjectKeyIdentifier.from_public_key(crt.public_key())
    assert datetime.fromisoformat(kc["expires_at"]) == crt.not_valid_after_utc, (kc["expires_at"], crt.not_valid_after_utc)
    status, listed = await api.call("GET", f"/clusters/{cid}/credentials")
    assert datetime.fromisoformat(listed["credentials"][0]["expires_at"]) == crt.not_valid_after_utc, listed
