"""The simulator's kubeadm/kubectl model (issue 11), at the command-handler level: what a guest
knows comes from the files written into it (the PKI, the kubeadm config), and a join succeeds only
while a control plane runs, with a known, unexpired token and the right CA hash."""
from __future__ import annotations

import json
import time

import yaml

from z9.common import pki
from z9.sim import kubeadm
from z9.sim.guest import Guest, Guests

EP = "203.0.113.10:6443"


def guest(guests: Guests, vmid: int) -> Guest:
    g = Guest(guests=guests, vmid=vmid, powered=True, booted=True, hostname=f"vm{vmid}")
    guests.guests[vmid] = g
    return g


def run(guests: Guests, g: Guest, *argv: str):
    return guests.run_command(g, list(argv), b"", {})


def write_pki(g: Guest, material: dict[str, str]) -> None:
    for name in kubeadm.PKI_FILES:
        g.write_file(kubeadm.PKI + name, material[name])


def init(guests: Guests, material: dict[str, str]) -> Guest:
    cp = guest(guests, 100)
    write_pki(cp, material)
    cp.write_file("/etc/z9/kubeadm.yaml", yaml.safe_dump_all([
        {"kind": "InitConfiguration", "nodeRegistration": {"name": "cp-0"}},
        {"kind": "ClusterConfiguration", "controlPlaneEndpoint": EP, "kubernetesVersion": "v1.33.0"}]))
    r = run(guests, cp, "kubeadm", "init", "--config", "/etc/z9/kubeadm.yaml")
    assert r.exitcode == 0, r.err
    return cp


def joiner(guests: Guests, vmid: int, token: str, ca_hash: str) -> Guest:
    w = guest(guests, vmid)
    w.write_file("/etc/z9/kubeadm.yaml", yaml.safe_dump({"kind": "JoinConfiguration", "nodeRegistration": {
        "name": f"workers-{vmid}"}, "discovery": {"bootstrapToken": {"apiServerEndpoint": EP, "token": token,
                                                                     "caCertHashes": [ca_hash]}}}))
    return w


def test_join_needs_running_api_known_token_and_right_ca_hash() -> None:
    kubeadm.SETTINGS["api_delay_s"] = 0.0
    guests = Guests(cluster=None)  # type: ignore[arg-type]
    material = pki.new_cluster_pki()
    cp = init(guests, material)
    ok_hash = pki.ca_cert_hash(material["ca.crt"])
    token = pki.new_bootstrap_token()
    # an unknown token
    w = joiner(guests, 201, token, ok_hash)
    r = run(guests, w, "kubeadm", "join", "--config", "/etc/z9/kubeadm.yaml")
    assert r.exitcode == 1 and "could not find a JWS signature" in r.err
    # registered on the control plane: the join works, and the node is Ready
    assert run(guests, cp, "kubeadm", "token", "create", token, "--ttl", "900s").exitcode == 0
    assert run(guests, cp, "kubeadm", "token", "create", token, "--ttl", "900s").exitcode == 1  # exists
    assert run(guests, w, "kubeadm", "join", "--config", "/etc/z9/kubeadm.yaml").exitcode == 0
    nodes = json.loads(run(guests, cp, "kubectl", "--kubeconfig", kubeadm.ADMIN_CONF, "get", "nodes", "-o", "json").out)
    assert {n["metadata"]["name"]: n["status"]["conditions"][0]["status"] for n in nodes["items"]} == {
        "cp-0": "True", "workers-201": "True"}
    # another cluster's CA hash is refused
    other = pki.ca_cert_hash(pki.new_cluster_pki()["ca.crt"])
    t2 = pki.new_bootstrap_token()
    run(guests, cp, "kubeadm", "token", "create", t2, "--ttl", "15m0s")
    bad = joiner(guests, 202, t2, other)
    r = run(guests, bad, "kubeadm", "join", "--config", "/etc/z9/kubeadm.yaml")
    assert r.exitcode == 1 and "none of the public keys" in r.err
    # a token that expired (fault), and a control plane that is down
    t3 = pki.new_bootstrap_token()
    run(guests, cp, "kubeadm", "token", "create", t3, "--ttl", "900s")
    assert kubeadm.expire_tokens(guests) >= 3
    late = joiner(guests, 203, t3, ok_hash)
    assert "JWS signature" in run(guests, late, "kubeadm", "join", "--config", "/etc/z9/kubeadm.yaml").err
    cp.powered = False
    t4 = pki.new_bootstrap_token()
    kubeadm.clusters(guests)[EP]["tokens"][t4] = time.time() + 900
    down = joiner(guests, 204, t4, ok_hash)
    r = run(guests, down, "kubeadm", "join", "--config", "/etc/z9/kubeadm.yaml")
    assert r.exitcode == 1 and "connection refused" in r.err


def test_init_needs_the_pki_and_a_matching_ca_key_and_api_comes_up_after_a_delay() -> None:
    kubeadm.SETTINGS["api_delay_s"] = 0.3
    guests = Guests(cluster=None)  # type: ignore[arg-type]
    cp = guest(guests, 100)
    cp.write_file("/etc/z9/kubeadm.yaml", yaml.safe_dump_all([
        {"kind": "InitConfiguration"}, {"kind": "ClusterConfiguration", "controlPlaneEndpoint": EP}]))
    r = run(guests, cp, "kubeadm", "init", "--config", "/etc/z9/kubeadm.yaml")
    assert r.exitcode == 1 and "ca.crt" in r.err
    a, b = pki.new_cluster_pki(), pki.new_cluster_pki()
    write_pki(cp, {**a, "ca.key": b["ca.key"]})
    r = run(guests, cp, "kubeadm", "init", "--config", "/etc/z9/kubeadm.yaml")
    assert r.exitcode == 1 and "does not match" in r.err
    write_pki(cp, a)
    assert run(guests, cp, "kubeadm", "init", "--config", "/etc/z9/kubeadm.yaml").exitcode == 0
    r = run(guests, cp, "kubectl", "--kubeconfig", kubeadm.ADMIN_CONF, "get", "--raw", "/readyz")
    assert r.exitcode == 1 and "refused" in r.err
    time.sleep(0.35)
    r = run(guests, cp, "kubectl", "--kubeconfig", kubeadm.ADMIN_CONF, "get", "--raw", "/readyz")
    assert r.exitcode == 0 and r.out == "ok"
    kubeadm.SETTINGS["api_delay_s"] = 1.0
