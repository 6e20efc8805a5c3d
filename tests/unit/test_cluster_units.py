"""Cluster pieces without a stack (issue 11): sealing the PKI, kubeconfig certificates, the
converge plan (pure), the bootstrap files."""
from __future__ import annotations

import json
from datetime import datetime, timezone

import kubernetes_validate
import pytest
import yaml

from z9.common import pki
from z9.common.errors import PermanentError
from z9.common.models import Job
from z9.resources.cluster.model import Cluster
from z9.resources.cluster.jobs import shared as _cluster
from z9.executor.proxmox import VmState


def test_seal_is_bound_to_the_cluster_and_the_key() -> None:
    key = pki.InstallationKey.parse(pki.InstallationKey.generate())
    material = pki.new_cluster_pki()
    sealed = key.seal("k8s_a", material)
    assert key.open("k8s_a", *sealed) == material
    assert material["ca.key"].encode() not in sealed[2]
    with pytest.raises(pki.SealError):
        key.open("k8s_b", *sealed)  # another cluster's row
    other = pki.InstallationKey.parse(pki.InstallationKey.generate())
    with pytest.raises(pki.SealError):
        other.open("k8s_a", *sealed)
    with pytest.raises(pki.SealError):
        pki.InstallationKey.parse("c2hvcnQ")


def _cluster_row(**over) -> Cluster:
    now = datetime.now(timezone.utc)
    base = dict(id="k8s_01jd3x5v8q2m6n4p7r9s1t3w5y", tenant_id="ten_x", region="dev-1", name="prod", version="1.33",
                image="debian-12", control_plane={"count": 1}, node_pools=[{"name": "workers", "count": 1}],
                endpoint_address_id="adr_x", endpoint_ip="203.0.113.10", members=[], initialized_at=None,
                status="creating", status_reason=None, status_before_delete=None, delete_after=None, observed_at=None,
                created_at=now, updated_at=now, deleted_at=None)
    base.update(over)
    return Cluster(**base)


def _vm(vmid: int, member: str, ide0: str = "none,media=cdrom") -> VmState:
    return VmState(vmid=vmid, node="pve1", config={"ide0": ide0}, status="running",
                   tags=frozenset({"z9-id-k8s_01jd3x5v8q2m6n4p7r9s1t3w5y", "z9-role-customer", f"z9-member-{member}"}))


def test_plan_scale_down_removes_highest_ordinals_first() -> None:
    c = _cluster_row(node_pools=[{"name": "workers", "count": 1}])
    world = _cluster.World(cluster=c, desired=_cluster.desired_members(c),
                           vms={m: _vm(100 + i, m) for i, m in enumerate(
                               ["cp-0", "workers-0", "workers-1", "workers-10", "workers-2"])},
                           nodes={"cp-0": True, "workers-0": True, "workers-1": True, "workers-2": True,
                                  "workers-10": True})
    job = Job.__new__(Job)
    steps = _cluster.plan(job, world)
    assert [(s.name, s.detail.get("member")) for s in steps] == [
        ("drain", "workers-10"), ("remove", "workers-10"), ("drain", "workers-2"), ("remove", "workers-2"),
        ("drain", "workers-1"), ("remove", "workers-1")]


def test_plan_init_then_join_in_one_parallel_step_and_detach_leftovers() -> None:
    c = _cluster_row(control_plane={"count": 3}, node_pools=[{"name": "workers", "count": 2}])
    job = Job.__new__(Job)
    steps = _cluster.plan(job, _cluster.World(cluster=c, desired=_cluster.desired_members(c)))
    assert [(s.name, s.detail) for s in steps] == [
        ("init", {"member": "cp-0"}), ("join", {"members": ["cp-1", "cp-2", "workers-0", "workers-1"]})]
    world = _cluster.World(cluster=c, desired=_cluster.desired_members(c),
                           vms={"cp-0": _vm(100, "cp-0", "isos:iso/z9-k8s_x-cp-0-0123456789abcdef.iso,media=cdrom")},
                           nodes={"cp-0": True})
    steps = _cluster.plan(job, world)
    assert [s.name for s in steps] == ["join", "detach_bootstrap"]
    assert steps[1].detail == {"members": ["cp-0"]}


def test_bootstrap_files_carry_keys_only_to_control_planes() -> None:
    c = _cluster_row()
    material = pki.new_cluster_pki()
    cp, worker = _cluster.desired_members(c)
    files = _cluster.bootstrap_files(c, material, cp, None)
    user = yaml.safe_load(files["user-data"])
    assert user["runcmd"] == [["sh", "-c", "kubeadm init --config /etc/z9/kubeadm.yaml && "
                                           "cat /etc/z9/kube-vip.yaml > /etc/kubernetes/manifests/kube-vip.yaml"]]
    assert {f["path"] for f in user["write_files"]} >= {"/etc/kubernetes/pki/ca.key", "/etc/kubernetes/pki/sa.key"}
    token = pki.new_bootstrap_token()
    w = yaml.safe_load(_cluster.bootstrap_files(c, material, worker, token)["user-data"])
    assert not any(f["path"].endswith(".key") for f in w["write_files"])
    cfg = yaml.safe_load(next(f["content"] for f in w["write_files"] if f["path"] == "/etc/z9/kubeadm.yaml"))
    assert cfg["discovery"]["bootstrapToken"] == {"apiServerEndpoint": "203.0.113.10:6443", "token": token,
                                                  "caCertHashes": [pki.ca_cert_hash(material["ca.crt"])]}
    # deterministic for one token: a retried attempt rebuilds the same ISO (same name, no second upload)
    assert _cluster.bootstrap_files(c, material, worker, token) == _cluster.bootstrap_files(c, material, worker, token)


def test_seen_reason_names_the_members_not_ready_and_why() -> None:
    seen = _cluster.Seen(members=[], whole=False, missing=["workers-1", "workers-2"],
                         notes={"workers-1": "cloud-init failed: disk full"})
    assert seen.reason() == "not a Ready node: workers-1 (cloud-init failed: disk full), workers-2"
    assert _cluster.Seen(members=[], whole=False, missing=["cp-0"], api=False).reason() == (
        "no control plane's API answers (every member reported not Ready)")
    assert _cluster.Seen(members=[], whole=True, missing=[]).reason() is None


def test_plan_replaces_a_member_whose_cloud_init_failed_after_it_joined() -> None:
    c = _cluster_row(control_plane={"count": 1}, node_pools=[{"name": "workers", "count": 2}])
    iso = "isos:iso/z9-k8s_x-workers-1-0123456789abcdef.iso,media=cdrom"
    world = _cluster.World(cluster=c, desired=_cluster.desired_members(c),
                           vms={"cp-0": _vm(100, "cp-0"), "workers-0": _vm(101, "workers-0"),
                                "workers-1": _vm(102, "workers-1", iso)},
                           nodes={"cp-0": True, "workers-0": True, "workers-1": True},
                           failed_boot={"workers-1": "disk full"})
    steps = _cluster.plan(Job.__new__(Job), world)
    assert [(s.name, s.detail.get("member") or s.detail.get("members")) for s in steps] == [
        ("drain", "workers-1"), ("replace", "workers-1"), ("join", ["workers-1"])]
    # a control plane that is an etcd member is not replaced automatically
    world.failed_boot = {"cp-0": "disk full"}
    with pytest.raises(PermanentError, match="cp-0.*not replaced automatically"):
        _cluster.plan(Job.__new__(Job), world)
    # a replace of a member that never joined does not keep cp-0 out of the join (cp-0 not Ready, cp-1 answers)
    c3 = _cluster_row(control_plane={"count": 3}, node_pools=[{"name": "workers", "count": 1}])
    world = _cluster.World(cluster=c3, desired=_cluster.desired_members(c3),
                           vms={m: _vm(100 + i, m) for i, m in enumerate(["cp-0", "cp-1", "cp-2", "workers-0"])},
                           nodes={"cp-0": False, "cp-1": True, "cp-2": True}, failed_boot={"workers-0": "x"})
    steps = _cluster.plan(Job.__new__(Job), world)
    assert [(s.name, s.detail.get("member") or s.detail.get("members")) for s in steps] == [
        ("replace", "workers-0"), ("join", ["cp-0", "workers-0"])]


# z9's bootstrap judged by the simulator's kubeadm model (the rules kubeadm's source documents, see
# z9.sim.kubeadm): every member's user-data as cloud-init runs it — write_files, then runcmd —
# for 3 control planes and two pools on every version the API offers, the pod network applied as
# the job applies it; every node ends Ready. Against the bootstrap before this change it failed on
# each rule: the workers' pre-written CA (join preflight), v1beta4 on 1.29/1.30, kube-vip without
# NET_ADMIN/NET_RAW and a kubeconfig, no pod network (nodes NotReady).
@pytest.mark.parametrize("version", ["1.29", "1.30", "1.31", "1.32", "1.33", "1.34"])
def test_the_bootstrap_of_every_offered_version_passes_the_kubeadm_model(version: str) -> None:
    from z9.resources.cluster.api import VERSIONS
    from z9.sim import kubeadm
    from z9.sim.guest import DPKG_STATUS, Guest, Guests, dpkg_status
    from z9.sim.server import KUBERNETES_IMAGES

    assert version in VERSIONS
    kubeadm.SETTINGS["api_delay_s"] = 0.0
    try:
        c = _cluster_row(version=version, control_plane={"count": 3},
                         node_pools=[{"name": "workers", "count": 2}, {"name": "batch", "count": 1}])
        material = pki.new_cluster_pki()
        guests = Guests(cluster=None)  # type: ignore[arg-type]

        release = KUBERNETES_IMAGES[f"debian-12-k8s-{version}"]  # the seed's image of that minor
        validated: set[int] = set()  # the control planes whose seed carried the pod network's manifest

        def boot(vmid: int, files: dict[str, str], m: _cluster.MemberSpec) -> Guest:
            g = guests.guests[vmid] = Guest(guests=guests, vmid=vmid, powered=True, booted=True)
            g.write_file(DPKG_STATUS, dpkg_status({p: f"{release}-1.1" for p in ("kubeadm", "kubelet", "kubectl")}))
            vm = {"cores": str(m.cores), "memory": str(m.memory_mib)}  # kubeadm's preflight reads them
            user = yaml.safe_load(files["user-data"])
            for f in user["write_files"]:
                g.write_file(f["path"], f["content"])
                if f["path"].endswith("kube-vip.yaml"):  # a Pod as this version's API server takes it
                    kubernetes_validate.validate(yaml.safe_load(f["content"]), f"{version}.0", strict=True)
                if f["path"] == _cluster.POD_NETWORK["manifest"]:  # the shipped pod network, object by object
                    for doc in yaml.safe_load_all(f["content"]):
                        kubernetes_validate.validate(doc, f"{version}.0", strict=True)
                    validated.add(vmid)
            for item in user["runcmd"]:
                r = guests.run_command(g, item, b"", vm)
                assert r.exitcode == 0, (vmid, item, r.err)
            return g

        members = _cluster.desired_members(c)
        cp0 = boot(100, _cluster.bootstrap_files(c, material, members[0], None, release=release), members[0])
        admin = ["kubectl", "--kubeconfig", kubeadm.ADMIN_CONF]
        r = guests.run_command(cp0, [*admin, "apply", "-f", _cluster.POD_NETWORK["manifest"]], b"", {})
        assert r.exitcode == 0, r.err
        assert "daemonset.apps/kube-flannel-ds created" in r.out, r.out
        for i, m in enumerate(members[1:], start=101):
            token = pki.new_bootstrap_token()
            assert guests.run_command(cp0, ["kubeadm", "token", "create", token, "--ttl", "900s"], b"",
                                      {}).exitcode == 0
            boot(i, _cluster.bootstrap_files(c, material, m, token, release=release), m)
        nodes = json.loads(guests.run_command(cp0, [*admin, "get", "nodes", "-o", "json"], b"", {}).out)
        ready = {n["metadata"]["name"]: n["status"]["conditions"][0]["status"] for n in nodes["items"]}
        assert ready == {m.name: "True" for m in members}
        # every control plane holds the VIP (each alone answers at the endpoint)
        ep = kubeadm.clusters(guests)[f"{c.endpoint_ip}:6443"]
        assert len(ep["control_planes"]) == 3
        assert validated == {100, 101, 102}, validated  # every control plane (cp-0, cp-1, cp-2) ships it
        assert ep["cni"]["source"] == _cluster.POD_NETWORK["manifest"] and ep["cni"]["version"] == "v0.26.1"
        for vmid in ep["control_planes"]:
            assert kubeadm.kube_vip_problem(guests.guests[vmid], str(c.endpoint_ip)) is None
    finally:
        kubeadm.SETTINGS["api_delay_s"] = 1.0


def test_the_last_boot_of_the_output_log_decides_a_token_refusal() -> None:
    refused = ('error execution phase preflight: couldn\'t validate the identity of the API Server: could not find '
               'a JWS signature in the cluster-info ConfigMap for token ID "abcdef"')
    log = f"{refused}\nTo see the stack trace of this error execute with --v=5 or higher\nCloud-init finished at boot 1\n"
    assert _cluster._last_boot(log)[0] == refused
    assert any(_cluster._TOKEN_REFUSED.search(ln) for ln in _cluster._last_boot(log))
    # the re-join's boot succeeded: the earlier refusal is history
    again = log + "This node has joined the cluster\nCloud-init finished at boot 2\n"
    assert _cluster._last_boot(again) == ["This node has joined the cluster"]
    assert not any(_cluster._TOKEN_REFUSED.search(ln) for ln in _cluster._last_boot(again))


def test_a_member_keeps_one_seed() -> None:
    vm = VmState(vmid=101, node="pve1", status="stopped", tags=frozenset(),
                 config={"ide2": "local-lvm:vm-101-cloudinit,media=cdrom", "scsi0": "local-lvm:vm-101-disk-0,size=2G",
                         "ide0": "isos:iso/z9-k8s_x-cp-0-0123456789abcdef.iso,media=cdrom"})
    assert _cluster.pve_cloudinit_drives(vm) == ["ide2"]  # Proxmox's drive goes; z9's ISO and the disk stay
    assert _cluster.kubeadm_api_version("1.30") == "kubeadm.k8s.io/v1beta3"
    assert _cluster.kubeadm_api_version("1.31") == "kubeadm.k8s.io/v1beta4"
