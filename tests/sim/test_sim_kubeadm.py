"""The simulator's kubeadm/kubectl model, at the command-handler level: what a guest knows comes
from the files written into it (the PKI, the kubeadm config, kube-vip's manifest), and a join
succeeds only while a control plane holds the endpoint, with a known, unexpired token and the right
CA hash; kubeadm's documented rules (config apiVersion per minor, preflight, kube-vip's needs, Ready
only with a pod network) are refused as kubeadm refuses them."""
from __future__ import annotations

import json
import time

import pytest
import yaml
from z9.common import pki
from z9.sim import kubeadm
from z9.sim.guest import DPKG_STATUS, ExecResult, Guest, Guests, dpkg_status

from tests.support import poll_sync

EP = "203.0.113.10:6443"
FLANNEL = "https://github.com/flannel-io/flannel/releases/download/v0.26.1/kube-flannel.yml"


def kube_vip(kubeconfig: str = kubeadm.SUPER_ADMIN_CONF, caps: tuple[str, ...] = ("NET_ADMIN", "NET_RAW"),
             mount: bool = True) -> str:
    c = {"name": "kube-vip", "image": "ghcr.io/kube-vip/kube-vip:v0.8.0",
         "env": [{"name": "address", "value": EP.split(":")[0]}, {"name": "cp_enable", "value": "true"}],
         "securityContext": {"capabilities": {"add": list(caps)}}}
    spec = {"hostNetwork": True, "containers": [c]}
    if mount:
        c["volumeMounts"] = [{"mountPath": kubeadm.ADMIN_CONF, "name": "kubeconfig"}]
        spec["volumes"] = [{"name": "kubeconfig", "hostPath": {"path": kubeconfig}}]
    return yaml.safe_dump({"apiVersion": "v1", "kind": "Pod", "spec": spec})


def init_config(version: str = "v1.33.0", api: str = "kubeadm.k8s.io/v1beta4", pod_subnet: str = "10.244.0.0/16") -> str:
    return yaml.safe_dump_all([
        {"apiVersion": api, "kind": "InitConfiguration", "nodeRegistration": {"name": "cp-0"}},
        {"apiVersion": api, "kind": "ClusterConfiguration", "controlPlaneEndpoint": EP, "kubernetesVersion": version,
         "networking": {"podSubnet": pod_subnet}}])


def install_kubernetes(g: Guest, release: str = "1.33.5", kubelet: str | None = None) -> Guest:
    """The guest's disk as a Kubernetes image has it: kubeadm, kubelet and kubectl installed (dpkg)."""
    g.write_file(DPKG_STATUS, dpkg_status({"kubeadm": f"{release}-1.1", "kubectl": f"{release}-1.1",
                                           "kubelet": f"{kubelet or release}-1.1"}))
    return g


def guest(guests: Guests, vmid: int, release: str | None = "1.33.5", kubelet: str | None = None) -> Guest:
    """A running guest of a Kubernetes image carrying ``release`` (None: a plain image)."""
    g = Guest(guests=guests, vmid=vmid, powered=True, booted=True, hostname=f"vm{vmid}")
    guests.guests[vmid] = g
    return install_kubernetes(g, release, kubelet) if release else g


# a VM of kubeadm's control-plane minimum and more (z9's smallest control plane: 2 cores, 2048 MiB)
VM = {"cores": "2", "memory": "2048"}


def run(guests: Guests, g: Guest, *argv: str, config: dict[str, str] | None = None):
    return guests.run_command(g, list(argv), b"", VM if config is None else config)


def write_pki(g: Guest, material: dict[str, str]) -> None:
    for name in kubeadm.PKI_FILES:
        g.write_file(kubeadm.PKI + name, material[name])


def init(guests: Guests, material: dict[str, str]) -> Guest:
    cp = guest(guests, 100)
    write_pki(cp, material)
    cp.write_file(kubeadm.KUBE_VIP, kube_vip())
    cp.write_file("/etc/z9/kubeadm.yaml", init_config())
    r = run(guests, cp, "kubeadm", "init", "--config", "/etc/z9/kubeadm.yaml")
    assert r.exitcode == 0, r.err
    assert run(guests, cp, "kubectl", "--kubeconfig", kubeadm.ADMIN_CONF, "apply", "-f", FLANNEL).exitcode == 0
    return cp


def joiner(guests: Guests, vmid: int, token: str, ca_hash: str, release: str = "1.33.5") -> Guest:
    w = guest(guests, vmid, release)
    w.write_file("/etc/z9/kubeadm.yaml", yaml.safe_dump({"apiVersion": "kubeadm.k8s.io/v1beta4",
                                                         "kind": "JoinConfiguration", "nodeRegistration": {
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
    cp.write_file(kubeadm.KUBE_VIP, kube_vip())
    cp.write_file("/etc/z9/kubeadm.yaml", init_config())
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

    def ready() -> ExecResult | None:  # the API server answers once it has started
        r = run(guests, cp, "kubectl", "--kubeconfig", kubeadm.ADMIN_CONF, "get", "--raw", "/readyz")
        return r if r.exitcode == 0 else None
    r = poll_sync(ready, 10, "the API server to answer")
    assert r.exitcode == 0 and r.out == "ok"
    kubeadm.SETTINGS["api_delay_s"] = 1.0


def _fresh(api_delay_s: float = 0.0) -> Guests:
    kubeadm.SETTINGS["api_delay_s"] = api_delay_s
    return Guests(cluster=None)  # type: ignore[arg-type]


def _ready(guests: Guests, cp: Guest) -> dict[str, tuple[str, str]]:
    nodes = json.loads(run(guests, cp, "kubectl", "--kubeconfig", kubeadm.ADMIN_CONF, "get", "nodes", "-o", "json").out)
    return {n["metadata"]["name"]: (n["status"]["conditions"][0]["status"], n["status"]["conditions"][0]["message"])
            for n in nodes["items"]}


# kubeadm's validateSupportedVersion (cmd/kubeadm/app/util/config/common.go): v1beta4 is experimental
# (refused by init/join) before 1.31; v1beta3 is read from 1.22, deprecated (a warning) from 1.31.
@pytest.mark.parametrize("version,api,refused", [
    ("v1.29.0", "kubeadm.k8s.io/v1beta4", "experimental API spec"),
    ("v1.30.0", "kubeadm.k8s.io/v1beta4", "experimental API spec"),
    ("v1.30.0", "kubeadm.k8s.io/v1beta3", None),
    ("v1.31.0", "kubeadm.k8s.io/v1beta4", None),
    ("v1.34.0", "kubeadm.k8s.io/v1beta3", None),
    ("v1.33.0", "kubeadm.k8s.io/v1beta2", "old API spec"),
    ("v1.36.0", "kubeadm.k8s.io/v1beta3", "old API spec"),  # removed in 1.36 (not offered by the API yet)
])
def test_init_reads_the_config_api_its_minor_supports(version: str, api: str, refused: str | None) -> None:
    guests = _fresh()
    cp = guest(guests, 100, release=version.lstrip("v"))  # an image of that release reads the config
    write_pki(cp, pki.new_cluster_pki())
    cp.write_file(kubeadm.KUBE_VIP, kube_vip())
    cp.write_file("/etc/z9/kubeadm.yaml", init_config(version, api))
    r = run(guests, cp, "kubeadm", "init", "--config", "/etc/z9/kubeadm.yaml")
    if refused:
        assert r.exitcode == 1 and refused in r.err and api in r.err, r.err
        assert EP not in kubeadm.clusters(guests)
    else:
        assert r.exitcode == 0, r.err
        minor = int(version.split(".")[1])
        assert ("deprecated API spec" in r.err) == (api.endswith("v1beta3") and minor >= 31), r.err


def test_a_worker_join_with_the_ca_prewritten_fails_preflight() -> None:
    guests = _fresh()
    material = pki.new_cluster_pki()
    cp = init(guests, material)
    token = pki.new_bootstrap_token()
    assert run(guests, cp, "kubeadm", "token", "create", token, "--ttl", "900s").exitcode == 0
    w = joiner(guests, 201, token, pki.ca_cert_hash(material["ca.crt"]))
    w.write_file(kubeadm.PKI + "ca.crt", material["ca.crt"])
    r = run(guests, w, "kubeadm", "join", "--config", "/etc/z9/kubeadm.yaml")
    assert r.exitcode == 1, r.err
    assert ("[ERROR FileAvailable--etc-kubernetes-pki-ca.crt]: /etc/kubernetes/pki/ca.crt already exists" in r.err), r.err
    assert "workers-201" not in kubeadm.clusters(guests)[EP]["nodes"]
    # kubeadm's own escape hatch turns it into a warning (z9 does not use it: it writes no CA)
    r = run(guests, w, "kubeadm", "join", "--config", "/etc/z9/kubeadm.yaml",
            "--ignore-preflight-errors=FileAvailable--etc-kubernetes-pki-ca.crt")
    assert r.exitcode == 0 and "[WARNING FileAvailable--etc-kubernetes-pki-ca.crt]" in r.err, r.err
    # a second join on the same disk: kubelet.conf exists and the kubelet's port is taken
    r = run(guests, w, "kubeadm", "join", "--config", "/etc/z9/kubeadm.yaml")
    assert r.exitcode == 1 and "FileAvailable--etc-kubernetes-kubelet.conf" in r.err and "Port-10250" in r.err, r.err


# checks.go InitNodeChecks: NumCPUCheck{ControlPlaneNumCPU} and MemCheck{ControlPlaneMem} (constants.go:
# 2 CPUs, 1700 MB), for init and for a control plane joining (isSecondaryControlPlane); the CPUs are
# the VM's vCPUs, the RAM what the guest's kernel reports (sysinfo's Totalram: less than the VM's memory)
@pytest.mark.parametrize("config,errors", [
    ({"cores": "1", "memory": "4096"}, ["[ERROR NumCPU]: the number of available CPUs 1 is less than the required 2"]),
    ({"cores": "1", "sockets": "2", "memory": "4096"}, []),
    ({"cores": "4", "vcpus": "1", "memory": "4096"}, ["[ERROR NumCPU]: the number of available CPUs 1"]),
    ({"cores": "2", "memory": "1024"}, ["[ERROR Mem]: the system RAM (928 MB) is less than the minimum 1700 MB"]),
    ({"cores": "2", "memory": "1700"}, ["[ERROR Mem]"]),  # the VM's 1700 MiB: the kernel keeps some
    ({"cores": "2", "memory": "current=2048"}, []),
    ({}, ["[ERROR NumCPU]", "[ERROR Mem]"]),  # qemu-server's defaults: 1 core, 512 MiB
])
def test_a_control_plane_below_kubeadms_minimum_fails_preflight(config: dict[str, str], errors: list[str]) -> None:
    guests = _fresh()
    cp = guest(guests, 100)
    write_pki(cp, pki.new_cluster_pki())
    cp.write_file(kubeadm.KUBE_VIP, kube_vip())
    cp.write_file("/etc/z9/kubeadm.yaml", init_config())
    r = run(guests, cp, "kubeadm", "init", "--config", "/etc/z9/kubeadm.yaml", config=config)
    if not errors:
        assert r.exitcode == 0, r.err
        return
    assert r.exitcode == 1 and "error execution phase preflight" in r.err, r.err
    for e in errors:
        assert e in r.err, r.err
    assert EP not in kubeadm.clusters(guests)
    # kubeadm's own escape hatch (z9 passes none)
    r = run(guests, cp, "kubeadm", "init", "--config", "/etc/z9/kubeadm.yaml",
            "--ignore-preflight-errors=NumCPU,Mem", config=config)
    assert r.exitcode == 0 and "[WARNING" in r.err, r.err


def test_a_control_plane_join_below_kubeadms_minimum_fails_preflight_a_worker_does_not() -> None:
    guests = _fresh()
    material = pki.new_cluster_pki()
    cp = init(guests, material)
    small = {"cores": "1", "memory": "1024"}
    token = pki.new_bootstrap_token()
    assert run(guests, cp, "kubeadm", "token", "create", token, "--ttl", "900s").exitcode == 0
    ca_hash = pki.ca_cert_hash(material["ca.crt"])
    w = joiner(guests, 201, token, ca_hash)
    assert run(guests, w, "kubeadm", "join", "--config", "/etc/z9/kubeadm.yaml", config=small).exitcode == 0
    c2 = guest(guests, 102)
    write_pki(c2, material)
    c2.write_file(kubeadm.KUBE_VIP, kube_vip(kubeadm.ADMIN_CONF))
    c2.write_file("/etc/z9/kubeadm.yaml", yaml.safe_dump({
        "apiVersion": "kubeadm.k8s.io/v1beta4", "kind": "JoinConfiguration", "nodeRegistration": {"name": "cp-1"},
        "controlPlane": {}, "discovery": {"bootstrapToken": {"apiServerEndpoint": EP, "token": token,
                                                             "caCertHashes": [ca_hash]}}}))
    r = run(guests, c2, "kubeadm", "join", "--config", "/etc/z9/kubeadm.yaml", config=small)
    assert r.exitcode == 1 and "[ERROR NumCPU]" in r.err and "[ERROR Mem]" in r.err, r.err
    assert "cp-1" not in kubeadm.clusters(guests)[EP]["nodes"]
    assert run(guests, c2, "kubeadm", "join", "--config", "/etc/z9/kubeadm.yaml").exitcode == 0


def test_a_second_init_on_the_same_disk_fails_preflight() -> None:
    guests = _fresh()
    cp = init(guests, pki.new_cluster_pki())
    r = run(guests, cp, "kubeadm", "init", "--config", "/etc/z9/kubeadm.yaml")
    assert r.exitcode == 1, r.err
    for check in ("Port-6443", "Port-10259", "Port-10257", "Port-10250", "Port-2379", "Port-2380",
                  "FileAvailable--etc-kubernetes-manifests-kube-apiserver.yaml",
                  "FileAvailable--etc-kubernetes-manifests-etcd.yaml", "DirAvailable--var-lib-etcd"):
        assert f"[ERROR {check}]" in r.err, (check, r.err)


@pytest.mark.parametrize("manifest,why", [
    (None, "no static pod manifest"),
    (kube_vip(caps=("NET_ADMIN",)), "NET_RAW"),
    (kube_vip(mount=False), "no kubeconfig mounted"),
    (kube_vip(kubeadm.ADMIN_CONF), "super-admin.conf"),  # 1.29+: admin.conf has no rights during init
])
def test_init_needs_a_kube_vip_that_can_hold_the_endpoint(manifest: str | None, why: str) -> None:
    guests = _fresh()
    cp = guest(guests, 100)
    write_pki(cp, pki.new_cluster_pki())
    if manifest is not None:
        cp.write_file(kubeadm.KUBE_VIP, manifest)
    cp.write_file("/etc/z9/kubeadm.yaml", init_config())
    r = run(guests, cp, "kubeadm", "init", "--config", "/etc/z9/kubeadm.yaml")
    assert r.exitcode == 1 and "wait-control-plane" in r.err and why in r.err, r.err
    assert EP not in kubeadm.clusters(guests)


def test_the_endpoint_answers_only_while_a_control_plane_holds_the_vip() -> None:
    guests = _fresh()
    cp = init(guests, pki.new_cluster_pki())
    readyz = ("kubectl", "--kubeconfig", kubeadm.ADMIN_CONF, "get", "--raw", "/readyz")
    assert run(guests, cp, *readyz).exitcode == 0
    # after init the node's kube-vip may use admin.conf (z9 switches it so); one without NET_RAW holds nothing
    cp.write_file(kubeadm.KUBE_VIP, kube_vip(kubeadm.ADMIN_CONF))
    assert run(guests, cp, *readyz).exitcode == 0
    cp.write_file(kubeadm.KUBE_VIP, kube_vip(kubeadm.ADMIN_CONF, caps=("NET_ADMIN",)))
    r = run(guests, cp, *readyz)
    assert r.exitcode == 1 and "refused" in r.err


def test_nodes_are_ready_only_with_a_pod_network() -> None:
    guests = _fresh()
    material = pki.new_cluster_pki()
    cp = guest(guests, 100)
    write_pki(cp, material)
    cp.write_file(kubeadm.KUBE_VIP, kube_vip())
    cp.write_file("/etc/z9/kubeadm.yaml", init_config())
    assert run(guests, cp, "kubeadm", "init", "--config", "/etc/z9/kubeadm.yaml").exitcode == 0
    status, message = _ready(guests, cp)["cp-0"]
    assert status == "False" and "cni plugin not initialized" in message
    r = run(guests, cp, "kubectl", "--kubeconfig", kubeadm.ADMIN_CONF, "apply", "-f", "https://example.com/cni.yaml")
    assert r.exitcode == 1 and "unable to read URL" in r.err
    r = run(guests, cp, "kubectl", "--kubeconfig", kubeadm.ADMIN_CONF, "apply", "-f", FLANNEL)
    assert r.exitcode == 0 and "daemonset.apps/kube-flannel-ds created" in r.out
    assert _ready(guests, cp)["cp-0"][0] == "True"
    r = run(guests, cp, "kubectl", "--kubeconfig", kubeadm.ADMIN_CONF, "apply", "-f", FLANNEL)
    assert "daemonset.apps/kube-flannel-ds unchanged" in r.out


def test_flannel_needs_the_pod_subnet_it_routes() -> None:
    guests = _fresh()
    cp = guest(guests, 100)
    write_pki(cp, pki.new_cluster_pki())
    cp.write_file(kubeadm.KUBE_VIP, kube_vip())
    cp.write_file("/etc/z9/kubeadm.yaml", init_config(pod_subnet="192.168.0.0/16"))
    assert run(guests, cp, "kubeadm", "init", "--config", "/etc/z9/kubeadm.yaml").exitcode == 0
    assert run(guests, cp, "kubectl", "--kubeconfig", kubeadm.ADMIN_CONF, "apply", "-f", FLANNEL).exitcode == 0
    status, message = _ready(guests, cp)["cp-0"]
    assert status == "False" and "pod cidr not assigned" in message


def test_a_token_past_its_ttl_has_no_jws_signature() -> None:
    guests = _fresh()
    material = pki.new_cluster_pki()
    cp = init(guests, material)
    token = pki.new_bootstrap_token()
    assert run(guests, cp, "kubeadm", "token", "create", token, "--ttl", "900s").exitcode == 0
    kubeadm.clusters(guests)[EP]["tokens"][token] = time.time() - 1  # its 900 s have passed
    w = joiner(guests, 201, token, pki.ca_cert_hash(material["ca.crt"]))
    r = run(guests, w, "kubeadm", "join", "--config", "/etc/z9/kubeadm.yaml")
    assert r.exitcode == 1
    assert f"could not find a JWS signature in the cluster-info ConfigMap for token ID \"{token.split('.')[0]}\"" in r.err


# Two cidata seeds on one member (z9's ISO and Proxmox's own cloud-init drive, cloned from the
# template's ide2) leave kubeadm to cloud-init's device order: in one of the two placements of the
# ISO (before or after ide2) the guest boots Proxmox's drive and kubeadm never runs — the member never
# becomes a node. Which placement loses is the NoCloud order the guest model implements; z9 attaches
# exactly one seed (test_clusters_e2e checks the members).
def test_two_seeds_leave_the_bootstrap_to_cloud_inits_device_order(pve, wait, tmp_path, admin) -> None:
    from z9.common.nocloud import build_nocloud_iso
    from z9.resources.cluster.jobs import shared as _cluster

    from tests.sim.test_sim_guest import clone, upload
    from tests.unit.test_cluster_units import _cluster_row

    ran = {}
    for vmid, key, ip in ((101, "ide0", "203.0.113.21"), (102, "ide3", "203.0.113.22")):
        c = _cluster_row(endpoint_ip=ip, version="1.33")
        files = _cluster.bootstrap_files(c, pki.new_cluster_pki(), _cluster.desired_members(c)[0], None)
        iso = build_nocloud_iso(user_data=files["user-data"], meta_data=files["meta-data"])
        assert wait(upload(pve, tmp_path, iso, name=f"seed-{vmid}.iso"))["exitstatus"] == "OK"
        clone(pve, wait, vmid, name=f"cp-{vmid}", template=9133)  # the seed's Kubernetes 1.33 image
        vm = pve.nodes("pve1").qemu(vmid)
        assert "cloudinit" in vm.config.get()["ide2"]  # the template's PVE drive came with the clone
        vm.config.put(**{key: f"local:iso/seed-{vmid}.iso,media=cdrom"}, **VM)  # kubeadm's minimum
        assert wait(vm.status.start.post())["exitstatus"] == "OK"
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and admin("get", f"/guests/{vmid}")["cloud_init"]["status"] != "done":
            time.sleep(0.05)
        g = admin("get", f"/guests/{vmid}")
        assert g["cloud_init"]["status"] == "done", g["cloud_init"]
        ran[key] = (g["inputs"]["source"], g["models"].get("kubeadm", {}).get("role"))
    booted_iso = [k for k, (src, _) in ran.items() if "iso/seed-" in src]
    assert len(booted_iso) == 1, ran  # one placement boots z9's ISO, the other Proxmox's drive
    loser = next(k for k in ran if k not in booted_iso)
    assert "cloudinit" in ran[loser][0] and ran[loser][1] is None, ran  # kubeadm never ran there
    assert ran[booted_iso[0]][1] == "control-plane", ran


# The image's kubeadm and kubelet against the control plane's version (kubeadm's skew rules:
# constants.go MinimumControlPlaneVersion = minor − 1, MinimumKubeletVersion = minor − 3;
# util/config/common.go NormalizeKubernetesVersion; preflight/checks.go KubernetesVersionCheck and
# KubeletVersionCheck; the Version Skew Policy: "kubelet must not be newer than kube-apiserver").
@pytest.mark.parametrize("image,kubelet,asked,outcome", [
    ("1.33.5", None, "v1.33.5", "ok"),
    ("1.33.5", "1.32.9", "v1.32.9", "ok"),  # one minor behind kubeadm, with a kubelet not newer: deployable
    ("1.33.5", None, "v1.32.9", "[ERROR KubeletVersion]: the kubelet version is higher than the control plane"),
    ("1.33.5", None, "v1.31.0", ("this version of kubeadm only supports deploying clusters with the control plane "
                                 "version >= 1.32.0. Current version: v1.31.0")),
    ("1.33.5", None, "v1.34.1", "warning: Kubernetes version is greater than kubeadm version"),
    ("1.33.5", "1.34.1", "v1.33.5", ("[ERROR KubeletVersion]: the kubelet version is higher than the control plane "
                                     "version. This is not a supported version skew and may lead to a malfunctional "
                                     "cluster. Kubelet version: \"1.34.1\" Control plane version: \"1.33.5\"")),
    ("1.33.5", "1.29.15", "v1.33.5", ("[ERROR KubeletVersion]: Kubelet version \"1.29.15\" is lower than kubeadm can "
                                      "support. Please upgrade kubelet")),
])
def test_init_holds_the_images_kubeadm_and_kubelet_to_the_version_skew(image: str, kubelet: str | None, asked: str,
                                                                        outcome: str) -> None:
    guests = _fresh()
    cp = guest(guests, 100, image, kubelet)
    write_pki(cp, pki.new_cluster_pki())
    cp.write_file(kubeadm.KUBE_VIP, kube_vip())
    cp.write_file("/etc/z9/kubeadm.yaml", init_config(asked))
    r = run(guests, cp, "kubeadm", "init", "--config", "/etc/z9/kubeadm.yaml")
    if outcome == "ok" or outcome.startswith("warning: "):
        assert r.exitcode == 0, r.err
        assert ("[WARNING KubernetesVersion]" in r.err) == outcome.startswith("warning: "), r.err
        if outcome.startswith("warning: "):
            assert outcome.removeprefix("warning: ") in r.err
        return
    assert r.exitcode == 1 and outcome in r.err, r.err
    assert EP not in kubeadm.clusters(guests)


def test_join_refuses_a_kubeadm_two_minors_ahead_of_the_cluster_and_reports_each_kubelet() -> None:
    guests = _fresh()
    material = pki.new_cluster_pki()
    cp = guest(guests, 100, "1.32.9")
    write_pki(cp, material)
    cp.write_file(kubeadm.KUBE_VIP, kube_vip())
    cp.write_file("/etc/z9/kubeadm.yaml", init_config("v1.32.9"))
    assert run(guests, cp, "kubeadm", "init", "--config", "/etc/z9/kubeadm.yaml").exitcode == 0
    assert run(guests, cp, "kubectl", "--kubeconfig", kubeadm.ADMIN_CONF, "apply", "-f", FLANNEL).exitcode == 0
    ca_hash = pki.ca_cert_hash(material["ca.crt"])
    tokens = [pki.new_bootstrap_token() for _ in range(3)]
    for t in tokens:
        assert run(guests, cp, "kubeadm", "token", "create", t, "--ttl", "900s").exitcode == 0
    # kubeadm 1.34 fetches the cluster's ClusterConfiguration (v1.32.9): below its minimum (1.33.0)
    w = joiner(guests, 201, tokens[0], ca_hash, release="1.34.1")
    r = run(guests, w, "kubeadm", "join", "--config", "/etc/z9/kubeadm.yaml")
    assert r.exitcode == 1 and ("this version of kubeadm only supports deploying clusters with the control plane "
                                "version >= 1.33.0. Current version: v1.32.9") in r.err, r.err
    # one minor ahead (1.33 into 1.32) and one behind (1.31 into 1.32): kubeadm joins both
    for vmid, token, release in ((202, tokens[1], "1.33.5"), (203, tokens[2], "1.31.13")):
        w = joiner(guests, vmid, token, ca_hash, release=release)
        r = run(guests, w, "kubeadm", "join", "--config", "/etc/z9/kubeadm.yaml")
        assert r.exitcode == 0, (release, r.err)
    nodes = json.loads(run(guests, cp, "kubectl", "--kubeconfig", kubeadm.ADMIN_CONF, "get", "nodes", "-o",
                           "json").out)["items"]
    assert {n["metadata"]["name"]: n["status"]["nodeInfo"]["kubeletVersion"] for n in nodes} == {
        "cp-0": "v1.32.9", "workers-202": "v1.33.5", "workers-203": "v1.31.13"}


def test_the_binaries_are_the_images_own() -> None:
    guests = _fresh()
    k8s, plain = guest(guests, 100, "1.33.5", kubelet="1.32.9"), guest(guests, 101, None)
    assert run(guests, k8s, "kubeadm", "version", "-o", "short").out == "v1.33.5\n"
    assert 'GitVersion:"v1.33.5"' in run(guests, k8s, "kubeadm", "version").out
    assert run(guests, k8s, "kubelet", "--version").out == "Kubernetes v1.32.9\n"
    for prog in ("kubeadm", "kubelet", "kubectl"):  # a plain image has none of them
        r = run(guests, plain, prog, "version")
        assert r.exitcode == 127 and f"{prog}: not found" in r.err, r


def test_the_pod_network_is_applied_from_the_file_the_seed_shipped() -> None:
    """``kubectl apply -f <file>``: the model reads the manifest in the guest (z9's rendering of
    Flannel v0.26.1), its release from the flanneld image and its network from net-conf.json; a
    missing file is kubectl's error, and another manifest is not a pod network the model knows."""
    from z9.resources.cluster.jobs import shared as _cluster

    guests = _fresh()
    cp = guest(guests, 100)
    write_pki(cp, pki.new_cluster_pki())
    cp.write_file(kubeadm.KUBE_VIP, kube_vip())
    cp.write_file("/etc/z9/kubeadm.yaml", init_config())
    assert run(guests, cp, "kubeadm", "init", "--config", "/etc/z9/kubeadm.yaml").exitcode == 0
    admin = ["kubectl", "--kubeconfig", kubeadm.ADMIN_CONF, "apply", "-f"]
    r = run(guests, cp, *admin, "/etc/z9/kube-flannel.yml")
    assert r.exitcode == 1 and r.err == 'error: the path "/etc/z9/kube-flannel.yml" does not exist\n', r
    cp.write_file("/etc/z9/other.yml", yaml.safe_dump({"apiVersion": "v1", "kind": "ConfigMap",
                                                       "metadata": {"name": "x"}}))
    assert run(guests, cp, *admin, "/etc/z9/other.yml").exitcode == 1
    assert set(_ready(guests, cp).values()) == {("False", kubeadm.NO_CNI)}
    cp.write_file("/etc/z9/kube-flannel.yml", yaml.safe_dump_all(_cluster.pod_network_manifest()))
    r = run(guests, cp, *admin, "/etc/z9/kube-flannel.yml")
    assert r.exitcode == 0 and "daemonset.apps/kube-flannel-ds created" in r.out, r
    assert "clusterrole.rbac.authorization.k8s.io/flannel created" in r.out, r.out
    c = kubeadm.clusters(guests)[EP]
    assert (c["cni"]["version"], c["cni"]["network"]) == ("v0.26.1", "10.244.0.0/16")
    assert _ready(guests, cp)["cp-0"][0] == "True"
    assert "unchanged" in run(guests, cp, *admin, "/etc/z9/kube-flannel.yml").out
