"""What ClusterCreate and ClusterReconcile share: converging a Kubernetes cluster's members to its
desired shape (issue 11). The kinds' modules are thin; the four phases are here.

Members and identity
    Member ``cp-<i>`` (control plane, ``i < control_plane.count``) and ``<pool>-<i>`` (``i <
    pool.count``) — stable ordinals: a resize only adds or removes the highest ordinals. Each
    member is one VM of the cluster through the VM machinery (:mod:`z9.executor.vms`): tags
    ``z9-id-<cluster>``, ``z9-role-customer``, ``z9-member-<name>``; two VMs carrying one member tag
    is a permanent error naming both. Its Kubernetes node is named like the member.

Bootstrap data: a NoCloud ISO (not guest-agent file writes)
    Bootstrap data reaches a member through the Proxmox API only. We chose a NoCloud seed ISO
    (:func:`z9.common.nocloud.build_nocloud_iso`) over ``agent/file-write`` because (1) the data is
    there at the guest's *first* boot, before any agent runs, so cloud-init (``write_files``,
    ``runcmd: kubeadm init|join``) does the whole bootstrap the way every image expects — file
    writes would need the guest up first and a second, z9-driven "now run kubeadm" exec whose
    loss or retry is harder to make idempotent; (2) one upload of a content-addressed file is
    easy to make exactly-once across executor crashes (the name is the content: present ⇒ done),
    whereas N file writes of ≤ 60 KiB each (``file-write`` caps ``content`` at 61440 chars and
    PVE caps bodies at 512 KiB) are N more requests per member; (3) the cloud-init result
    (``cloud-init status``) then tells exactly whether the bootstrap worked. The ISO is named by
    identity and content hash — ``z9-<cluster>-<member>-<sha256[:16]>.iso`` — never by vmid
    (PVE recycles vmids), uploaded with its SHA-256 (the ``imgcopy`` task verifies it) to
    ``cluster_bootstrap_storage`` on the member's node (shared storage: every node sees it; a
    node-local one: the member's own node, the one its VM runs on — CAPMOX#112), attached as
    ``ide0`` as the member's **only** seed (PVE's own cloud-init drive, cloned from the template,
    is removed in the same config write: with two ``cidata`` devices cloud-init's NoCloud picks
    one by its own device order — see :func:`_attach_seed`), and — since it holds keys (control
    planes get the cluster's CA keys) and a join token — set to ``none`` and deleted from storage
    as soon as the member is a Ready node.

Image contract
    The cluster's image ships kubeadm, kubelet and kubectl of the cluster's Kubernetes minor, a
    container runtime with the standard CNI plugins (``/opt/cni/bin``: bridge, portmap, loopback —
    what Flannel's CNI config chains), cloud-init with NoCloud, and the QEMU guest agent. z9 brings
    the rest: the kubeadm config in the API the minor reads (:func:`kubeadm_api_version`), the
    kube-vip static pod, and the pod network (:data:`POD_NETWORK`: Flannel at a pinned release,
    whose manifest z9 renders and ships in every control plane's seed — never fetched — and the job
    applies on a control plane whose API answers — by the job, not by runcmd, so that z9 reads its
    result back; ``kubectl apply`` is idempotent). The simulator's kubeadm model (``simulator/z9/sim/kubeadm.py``) holds z9 to kubeadm's
    documented rules for all of it.

Joins
    The first control plane runs ``kubeadm init`` with the cluster's PKI (z9 owns it; kubeadm's
    external-CA mode); every other member joins with a **fresh bootstrap token** z9 mints
    (:func:`z9.common.pki.new_bootstrap_token`), registers on a running control plane through
    the agent (``kubeadm token create <token> --ttl <cluster_join_token_ttl_s>s``) and ships with
    the CA hash. The token is remembered in the job's memo — sealed with the installation key like
the cluster's keys, never in clear — *before* it is registered, so a retried
    attempt rebuilds the same ISO (same name: no second upload); a token older than half its ttl
    for a member not started yet is replaced (a scale-up a day later works: each join mints its own).
    A member that booted after its token's lifetime (a held or slow boot) is refused by kubeadm's
    discovery ("could not find a JWS signature … for token ID"): the job reads that from the
    guest's own report (``cloud-init status`` error, kubeadm's text in the boot's output log), mints
    a new token, swaps a new ISO for the old one (deleted; the new instance-id makes cloud-init run
    the bootstrap again) and reboots the VM — up to :data:`MAX_REJOINS` times, then a permanent error.

Phases
observe  the cluster row, the desired members, every VM of the cluster by tag (per member), and
         the nodes the API reports (``kubectl get nodes -o json`` through the agent of the first
         control plane whose API answers; None when none does).
plan     (pure) ``ip_filter`` (members not provisioned by this plan whose IP filter is not as
         wanted — their private address, a control plane's the endpoint too —, read back from
         Proxmox at every observe; a control plane without the endpoint in it cannot serve the
         API) → ``init`` (cp-0, while no API answers) → ``replace`` (a member whose cloud-init
         failed and that never became a node — except a join refused for its token, which the
         ``join`` step re-runs on the same VM —, or did but was never confirmed — then ``drain``
         first; a control plane that is a node is refused, never replaced: it is an etcd member —
         its VM goes, a new instance joins) → ``join`` (every desired member that is not
         a Ready node: booted **in parallel** in one step; each member's VM plan puts its IP
         filter on before its first start) → per extra member, highest ordinal
         first: ``drain`` then ``remove`` → ``remove_clone`` (untagged clones, known from the
         clone ledger, of members no longer desired) → ``detach_bootstrap`` (Ready members still
         holding their ISO) → ``delete_isos`` (the cluster's ISOs no member boots from: a removed
         member's, a Ready member's built with a token since replaced).
apply    each step re-reads what it acts on; clones through the VM machinery's ladder (no second
         clone after a crash); readiness is verified **inside** the guests: ``cloud-init status``
         done, ``kubectl get --raw /readyz`` ``ok`` on control planes, the member a Ready node.
         A member whose cloud-init fails is a permanent error naming it with cloud-init's error
         text and the last line of its output log.
verify   observe again: every desired member a Ready node, nothing extra left.
"""
from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import logging
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from z9.common import nocloud, pki, store
from z9.common.errors import Cancelled, PermanentError, TemporaryError
from z9.common.models import Job
from z9.resources.cluster.model import Cluster
from z9.resources.cluster import CLUSTER
from z9.common.tags import identity_tag

from z9.executor import guard, vms
from z9.executor.context import Drift, JobContext, Step, StepKind, StepKinds
from z9.executor.proxmox import AgentUnavailable, VmState
from z9.resources.cluster import store as cluster_store

log = logging.getLogger("z9.executor.cluster")

ADMIN_CONF = "/etc/kubernetes/admin.conf"
SUPER_ADMIN_CONF = "/etc/kubernetes/super-admin.conf"
ADMIN = ["--kubeconfig", ADMIN_CONF]
KUBEADM_CONFIG = "/etc/z9/kubeadm.yaml"
KUBE_VIP_MANIFEST = "/etc/kubernetes/manifests/kube-vip.yaml"
KUBE_VIP_STAGED = "/etc/z9/kube-vip.yaml"  # put in place after kubeadm init/join (see bootstrap_files)
KUBE_VIP_IMAGE = "ghcr.io/kube-vip/kube-vip:v0.8.0"
# The pod network every cluster gets: Flannel at a pinned release, its manifest rendered by z9
# (:func:`pod_network_manifest`) and shipped in every control plane's seed (``manifest``: the file),
# applied by the job on the first control plane whose API answers (kubectl apply: idempotent) —
# never fetched at boot. Its net-conf.json network is 10.244.0.0/16, which the
# ClusterConfiguration's networking.podSubnet must be (the controller-manager then allocates each
# node a podCIDR).
POD_NETWORK = {"name": "flannel", "version": "v0.26.1", "pod_subnet": "10.244.0.0/16",
               "manifest": "/etc/z9/kube-flannel.yml",
               # the release's images (its kube-flannel.yml): flanneld and its CNI plugin
               "image": "docker.io/flannel/flannel:v0.26.1",
               "cni_plugin_image": "docker.io/flannel/flannel-cni-plugin:v1.5.1-flannel2"}


def pod_network_manifest() -> list[dict[str, Any]]:
    """Flannel v0.26.1's objects as its release's ``kube-flannel.yml`` defines them (flannel-io/
    flannel ``Documentation/kube-flannel.yml`` at v0.26.1): the ``kube-flannel`` namespace (Pod
    Security ``privileged``: flanneld needs the host network and NET_ADMIN), its RBAC (nodes read,
    ``nodes/status`` patched: flanneld's kube subnet manager writes each node's lease annotations),
    the ``kube-flannel-cfg`` ConfigMap (the CNI conflist — flannel delegating to the bridge plugin,
    portmap chained — and ``net-conf.json``: :data:`POD_NETWORK`'s subnet, VXLAN) and the
    ``kube-flannel-ds`` DaemonSet (init containers copying the flannel CNI binary to /opt/cni/bin and
    the conflist to /etc/cni/net.d; flanneld ``--ip-masq --kube-subnet-mgr``). Rendered here and
    shipped in the seed, so a node never fetches it; validated against Kubernetes' schemas of every
    offered minor in the tests."""
    labels = {"tier": "node", "app": "flannel", "k8s-app": "flannel"}
    ns = "kube-flannel"
    cni_conf = {"name": "cbr0", "cniVersion": "0.3.1", "plugins": [
        {"type": "flannel", "delegate": {"hairpinMode": True, "isDefaultGateway": True}},
        {"type": "portmap", "capabilities": {"portMappings": True}}]}
    net_conf = {"Network": POD_NETWORK["pod_subnet"], "EnableNFTables": False, "Backend": {"Type": "vxlan"}}
    image, plugin = POD_NETWORK["image"], POD_NETWORK["cni_plugin_image"]
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": {
            "k8s-app": "flannel", "pod-security.kubernetes.io/enforce": "privileged"}}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": "flannel", "labels": {"k8s-app": "flannel"}},
         "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]},
                   {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]},
                   {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": "flannel", "labels": {"k8s-app": "flannel"}},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "flannel"},
         "subjects": [{"kind": "ServiceAccount", "name": "flannel", "namespace": ns}]},
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": "flannel", "namespace": ns, "labels": {"k8s-app": "flannel"}}},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "kube-flannel-cfg", "namespace": ns,
                                                               "labels": labels},
         "data": {"cni-conf.json": json.dumps(cni_conf, indent=2) + "\n",
                  "net-conf.json": json.dumps(net_conf, indent=2) + "\n"}},
        {"apiVersion": "apps/v1", "kind": "DaemonSet",
         "metadata": {"name": "kube-flannel-ds", "namespace": ns, "labels": labels},
         "spec": {"selector": {"matchLabels": {"app": "flannel"}},
                  "template": {"metadata": {"labels": labels}, "spec": {
                      "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                          "nodeSelectorTerms": [{"matchExpressions": [
                              {"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]}]}]}}},
                      "hostNetwork": True, "priorityClassName": "system-node-critical",
                      "tolerations": [{"operator": "Exists", "effect": "NoSchedule"}],
                      "serviceAccountName": "flannel",
                      "initContainers": [
                          {"name": "install-cni-plugin", "image": plugin, "command": ["cp"],
                           "args": ["-f", "/flannel", "/opt/cni/bin/flannel"],
                           "volumeMounts": [{"name": "cni-plugin", "mountPath": "/opt/cni/bin"}]},
                          {"name": "install-cni", "image": image, "command": ["cp"],
                           "args": ["-f", "/etc/kube-flannel/cni-conf.json", "/etc/cni/net.d/10-flannel.conflist"],
                           "volumeMounts": [{"name": "cni", "mountPath": "/etc/cni/net.d"},
                                            {"name": "flannel-cfg", "mountPath": "/etc/kube-flannel/"}]}],
                      "containers": [{
                          "name": "kube-flannel", "image": image, "command": ["/opt/bin/flanneld"],
                          "args": ["--ip-masq", "--kube-subnet-mgr"],
                          "resources": {"requests": {"cpu": "100m", "memory": "50Mi"}},
                          "securityContext": {"privileged": False,
                                              "capabilities": {"add": ["NET_ADMIN", "NET_RAW"]}},
                          "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                                  {"name": "POD_NAMESPACE",
                                   "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                                  {"name": "EVENT_QUEUE_DEPTH", "value": "5000"}],
                          "volumeMounts": [{"name": "run", "mountPath": "/run/flannel"},
                                           {"name": "flannel-cfg", "mountPath": "/etc/kube-flannel/"},
                                           {"name": "xtables-lock", "mountPath": "/run/xtables.lock"}]}],
                      "volumes": [{"name": "run", "hostPath": {"path": "/run/flannel"}},
                                  {"name": "cni-plugin", "hostPath": {"path": "/opt/cni/bin"}},
                                  {"name": "cni", "hostPath": {"path": "/etc/cni/net.d"}},
                                  {"name": "flannel-cfg", "configMap": {"name": "kube-flannel-cfg"}},
                                  {"name": "xtables-lock",
                                   "hostPath": {"path": "/run/xtables.lock", "type": "FileOrCreate"}}]}}}},
    ]
# kubeadm's discovery when the token is unknown or expired (cmd/kubeadm/app/discovery/token/token.go)
_TOKEN_REFUSED = re.compile(r"could not find a JWS signature in the cluster-info ConfigMap for token ID")
MAX_REJOINS = 3
_MEMBER_RE = re.compile(r"^(?P<pool>[a-z][a-z0-9-]*)-(?P<ordinal>\d+)$")
BOOTSTRAP_DRIVE = "ide0"


@dataclass(frozen=True)
class MemberSpec:
    name: str  # cp-0, workers-2
    role: str  # control-plane | worker
    pool: str | None
    ordinal: int
    cores: int
    memory_mib: int
    disk_gib: int


@dataclass
class World:
    cluster: Cluster | None
    desired: list[MemberSpec] = field(default_factory=list)
    vms: dict[str, VmState] = field(default_factory=dict)  # member -> its VM
    nodes: dict[str, bool] | None = None  # node name -> Ready; None: no API answered
    api_member: str | None = None  # the control plane whose API answered
    failed_boot: dict[str, str] = field(default_factory=dict)  # member -> cloud-init error (never joined)
    superseded: str | None = None
    isos: list[tuple[str, str]] = field(default_factory=list)  # the cluster's bootstrap ISOs: (node, volid)
    clones: list[VmState] = field(default_factory=list)  # untagged clones of ours for members not desired
    pod_network: bool = False  # this attempt applied the pod network's manifest (kubectl apply) already
    # a credentials rotation (job args ``client_ca``): the users' client-CA bundle the API servers
    # must trust, and the running control planes whose file is not it yet; ``client_ca`` the users'
    # client CA (crt, key) kube-controller-manager's kube-apiserver-client signer must use
    client_ca_bundle: str | None = None
    client_ca: tuple[str, str] | None = field(default=None, repr=False)
    client_ca_signers: list[str] = field(default_factory=list)  # control planes holding the signer's files
    client_ca_stale: list[str] = field(default_factory=list)
    client_ca_unreachable: list[str] = field(default_factory=list)  # control planes not running
    unfiltered: list[str] = field(default_factory=list)  # members whose firewall (IP filter, rules) is not as wanted
    dns_ok: set[str] = field(default_factory=set)  # members whose resolv.conf this attempt saw name a nameserver
    kubeadm_ok: set[str] = field(default_factory=set)  # members whose kubeadm this attempt saw at the image's release


def desired_members(cluster: Cluster) -> list[MemberSpec]:
    cp = cluster.control_plane
    out = [MemberSpec(f"cp-{i}", "control-plane", None, i, int(cp.get("cores", 2)), int(cp.get("memory_mib", 4096)),
                      int(cp.get("disk_gib", 30))) for i in range(int(cp["count"]))]
    for p in cluster.node_pools:
        out += [MemberSpec(f"{p['name']}-{i}", "worker", p["name"], i, int(p.get("cores", 2)),
                           int(p.get("memory_mib", 4096)), int(p.get("disk_gib", 30))) for i in range(int(p["count"]))]
    return out


def ordinal_key(member: str) -> tuple[str, int]:
    m = _MEMBER_RE.match(member)
    return (m["pool"], int(m["ordinal"])) if m else (member, -1)


def member_hostname(cluster: Cluster, m: MemberSpec) -> str:
    """The member's VM name and hostname, ``<cluster name>-<member>``, always one DNS label (≤ 63:
    a 63-character cluster name with a 28-character pool made 94) — the cluster name is shortened,
    never the member (:func:`z9.executor.vms.dns_label`). Derived rather than refused at the API:
    pools are added and grown later, and no API field shows this name."""
    return vms.dns_label(cluster.name, m.name)


def vm_spec(cluster: Cluster, m: MemberSpec, private: vms.PrivateAddress | None = None,
            addresses: Mapping[str, str] | None = None) -> vms.VmSpec:
    """The member's VM: cloned from the cluster's image, agent on (readiness is read inside). With an
    address on the region's private network (``private``; its bootstrap ISO's network-config gives
    it to the guest: :func:`network_config`) the VM's IP filter lets it send from that address only
    — and, on a control plane, from the cluster's endpoint, which kube-vip moves between them. Its
    firewall (:func:`member_firewall`) opens what kubeadm's members need of each other, from
    ``addresses`` (member → its private address: every member's known so far)."""
    allowed: tuple[str, ...] = ()
    if private is not None:
        allowed = (private.ip,)
        if m.role == "control-plane" and cluster.endpoint_ip is not None:
            allowed += (_ip(cluster.endpoint_ip),)
    return vms.VmSpec(owner=cluster.id, member=m.name, name=member_hostname(cluster, m), image=cluster.image,
                      cores=m.cores, memory_mib=m.memory_mib, disk_gib=m.disk_gib, config={"agent": "1"},
                      ip_filter=allowed, firewall=member_firewall(cluster, m, addresses or {}))


# What a member accepts, from kubeadm's "Ports and Protocols" (kubernetes/website
# content/en/docs/reference/networking/ports-and-protocols.md) and Flannel's backends
# (flannel-io/flannel Documentation/backends.md: VXLAN "Port: UDP port to use for sending encapsulated
# packets. Defaults to kernel default, currently 8472"). kube-scheduler (10259) and
# kube-controller-manager (10257) serve "Self" only: loopback, not through the VM's tap. kube-vip
# (ARP mode) elects its leader through the API server and announces the endpoint by ARP, which
# pve-firewall's IP rules do not filter: it needs no port of its own.
API_SERVER = ("tcp", "6443", "kube-apiserver (kubeadm Ports and Protocols: used by All)")
ETCD = ("tcp", "2379:2380", "etcd server client API and peers (kubeadm Ports and Protocols: kube-apiserver, etcd)")
KUBELET = ("tcp", "10250", "kubelet API (kubeadm Ports and Protocols: Self, Control plane)")
POD_NETWORK_VXLAN = ("udp", "8472", "Flannel VXLAN, the pod network (flannel Documentation/backends.md)")
SOURCE_MAX = 512  # pve-firewall Firewall.pm $rule_properties: source/dest maxLength 512


def member_firewall(cluster: Cluster, m: MemberSpec, addresses: Mapping[str, str]) -> vms.FirewallSpec:
    """A member's VM firewall: nothing in but the ports kubeadm's members need of each other, from
    those members only (their private addresses; a region without a private network gives members
    DHCP leases z9 cannot know: the ports are then open to the network), and the API server from
    anywhere on a control plane (the customers' kubectl, through the endpoint). Outbound accepted
    (image pulls, the join's discovery); replies come back as ESTABLISHED."""
    def sources(members: list[str]) -> list[str]:
        """The members' addresses as ``source`` lists of at most 512 characters each (pve-firewall's
        ``source`` maxLength: a large cluster's members need several rules)."""
        out: list[str] = []
        for ip in (addresses[n] for n in sorted(members, key=ordinal_key) if n in addresses):
            if out and len(out[-1]) + 1 + len(ip) <= SOURCE_MAX:
                out[-1] += "," + ip
            else:
                out.append(ip)
        return out

    cps = [n for n in addresses if n.startswith("cp-")]
    everyone = list(addresses)
    rules = []

    def rule(port: tuple[str, str, str], members: list[str] | None) -> None:
        proto, dport, why = port
        for source in (sources(members) or [None]) if members is not None else [None]:
            rules.append(vms.FwRule("in", "ACCEPT", f"cluster {cluster.id}: {why}", proto=proto, dport=dport,
                                    source=source))

    if m.role == "control-plane":
        rule(API_SERVER, None)
        rule(ETCD, cps)
    rule(KUBELET, cps)
    rule(POD_NETWORK_VXLAN, everyone)
    return vms.FirewallSpec(policy_in="DROP", policy_out="ACCEPT", rules=tuple(rules))


async def member_private_address(ctx: JobContext, world: World, m: MemberSpec) -> vms.PrivateAddress | None:
    """The member's address on the region's private network: the one it has, or — for a member
    without a VM yet — one taken for it now. A member whose VM was made before the region had a
    private network keeps the DHCP address its guest took at its first boot (no filter: it would
    drop that address)."""
    assert world.cluster is not None
    have = await store.vm_private_addresses_of(ctx.pool, world.cluster.id)
    if m.name in have:
        return vms.private_address_at(ctx, have[m.name])
    if m.name in world.vms:
        return None
    return await vms.private_address(ctx, world.cluster.id, m.name)


async def _observe_filters(ctx: JobContext, world: World) -> None:
    """The desired members whose VM's IP filter is not as their spec wants it (their address,
    a control plane's the endpoint too): read back from Proxmox, every member at once."""
    assert world.cluster is not None
    have = await store.vm_private_addresses_of(ctx.pool, world.cluster.id)
    todo = []
    for m in world.desired:
        vm = world.vms.get(m.name)
        private = vms.private_address_at(ctx, have[m.name]) if m.name in have else None
        if vm is None or vm.lock:
            continue  # (a member on DHCP — no private address — has its firewall compared all the same)
        todo.append((m, vm, vm_spec(world.cluster, m, private, have)))
    oks = await asyncio.gather(*(vms.firewall_ok(ctx, spec, vm) for _, vm, spec in todo))
    world.unfiltered = sorted((m.name for (m, _, _), ok in zip(todo, oks) if not ok), key=ordinal_key)


def network_config(vm: VmState, private: vms.PrivateAddress | None, nameservers: Sequence[str] = ()) -> str:
    """The NoCloud ``network-config`` of a member: its first NIC (by its MAC) with its private
    address (``private``) or DHCP (the region has no private network), and its DNS — version 1, as
    Proxmox's own cloud-init drive writes it (qemu-server ``PVE/QemuServer/Cloudinit.pm``
    ``nocloud_network``: ``physical``, ``name: eth0``, a ``static`` subnet with ``address``/
    ``gateway`` or ``dhcp4``, then ``type: nameserver`` with the ``address`` list). The nameservers
    are the private network's own, else the region's (``nameservers``): Proxmox's drive, which a
    member no longer has, fell back to the node's resolv.conf (``get_dns_conf``); z9's ISO must
    name them, or Debian's renderer writes no ``dns-nameservers`` and the guest has no DNS."""
    mac = ""
    for part in str(vm.config.get("net0", "")).split(","):
        k, _, v = part.partition("=")
        if k in ("virtio", "e1000", "rtl8139", "vmxnet3", "macaddr") and re.fullmatch(r"[0-9A-Fa-f:]{17}", v):
            mac = v.lower()
    if not mac:
        raise TemporaryError(f"VM {vm.vmid}: no MAC address on net0 yet ({vm.config.get('net0')!r})")
    subnet: dict[str, Any] = {"type": "dhcp4"}
    if private is not None:
        subnet = {"type": "static", "address": f"{private.ip}/{private.prefix}"}
        if private.gateway:
            subnet["gateway"] = private.gateway
        nameservers = private.nameservers or nameservers
    config: list[dict[str, Any]] = [{"type": "physical", "name": "eth0", "mac_address": mac, "subnets": [subnet]}]
    if nameservers:
        config.append({"type": "nameserver", "address": list(nameservers)})
    return yaml.safe_dump({"version": 1, "config": config}, sort_keys=False)


# ================================================================ observe

async def observe(ctx: JobContext, *, with_isos: bool = True) -> World:
    cluster = await CLUSTER.get(ctx.pool, ctx.job.resource_id)
    if cluster is None or cluster.status in ("destroying", "deleted"):
        return World(cluster=cluster, superseded=cluster.status if cluster else "gone")
    world = World(cluster=cluster, desired=desired_members(cluster))
    by_member: dict[str, list[VmState]] = {}
    for vm in await vms.find_vms(ctx, cluster.id):
        by_member.setdefault(vms.member_of(vm), []).append(vm)
    for member, found in by_member.items():
        if len(found) > 1:
            raise PermanentError(f"cluster {cluster.id}: {len(found)} VMs carry member tag z9-member-{member} "
                                 f"({', '.join(f'VM {v.vmid} on {v.node}' for v in found)}); an operator must remove "
                                 "the extra one")
        world.vms[member] = found[0]
    world.nodes, world.api_member = await read_nodes(ctx, world)
    await _observe_filters(ctx, world)
    if ctx.job.args.get("client_ca"):
        await _observe_client_ca(ctx, world)
    if with_isos:
        world.isos = await cluster_isos(ctx, cluster.id)
        # clones of members no longer desired that were never tagged (a scale-up cut short before
        # its configure step, then shrunk back): only the clone ledger knows them
        desired = {m.name for m in world.desired}
        requests = [r for r in await vms.clone_requests(ctx, cluster.id) if r.member not in desired]
        if requests:
            world.clones = await vms.find_own_clones(ctx, cluster.id, requests,
                                                     {v.vmid for found in by_member.values() for v in found})
    if world.nodes is not None:
        # A member whose cloud-init failed gets a new VM — a new instance — with a fresh token:
        # its bootstrap ran once and will not run again on that instance. Either it never became
        # a node (its join was refused: a token expired while it booted, …), or it did but was
        # never confirmed (it still holds its bootstrap ISO: cloud-init failed after the join) —
        # a re-run must not call that member ready when the first attempt said it failed.
        desired = {m.name for m in world.desired}
        for member, vm in world.vms.items():
            if vm.running and member in desired and (member not in world.nodes or _bootstrap_volume(vm)):
                failed = await cloud_init_error(ctx, vm)
                # a join refused for its token (it expired before the member booted) is re-run with
                # a new token by the join step (provision → _rejoin), not replaced
                if failed and not (member not in world.nodes and await join_token_refused(ctx, vm)):
                    world.failed_boot[member] = failed
    return world


async def _observe_client_ca(ctx: JobContext, world: World) -> None:
    """After a credentials rotation: which running control planes do not trust the new users'
    client CA yet (their ``client-ca-bundle.crt`` read back through the agent)."""
    assert world.cluster is not None
    material = await material_of(ctx, world.cluster)
    world.client_ca_bundle = pki.client_ca_bundle(material)
    if world.client_ca_bundle is None:
        return
    world.client_ca = (material["client-ca.crt"], material["client-ca.key"])
    want = hashlib.sha256(world.client_ca_bundle.encode()).hexdigest()
    want_crt = hashlib.sha256(world.client_ca[0].encode()).hexdigest()
    for member in sorted((m for m in world.vms if m.startswith("cp-")), key=ordinal_key):
        vm = world.vms[member]
        if not vm.running:  # it would come back trusting the old CA: the rotation waits for it
            world.client_ca_unreachable.append(member)
            continue
        try:
            data = await ctx.pve.agent_file_read(vm.node, vm.vmid, pki.CLIENT_CA_BUNDLE)
            # the signer's certificate (its key is written before it: a current crt means both)
            crt = await ctx.pve.agent_file_read(vm.node, vm.vmid, pki.CLIENT_CA_CRT)
        except AgentUnavailable:
            data = crt = None
        # a control plane bootstrapped before its controller-manager signed with the users' client
        # CA has no such crt (nor the flags naming it): it gets the bundle only
        if crt is not None:
            world.client_ca_signers.append(member)
        if data is None or hashlib.sha256(data).hexdigest() != want \
                or (crt is not None and hashlib.sha256(crt).hexdigest() != want_crt):
            world.client_ca_stale.append(member)


async def cloud_init_error(ctx: JobContext, vm: VmState) -> str | None:
    """cloud-init's error text when it ended in error in ``vm``; None otherwise (or unknown)."""
    try:
        code, out, _ = await ctx.pve.agent_exec(vm.node, vm.vmid, ["cloud-init", "status", "--format", "json"],
                                                timeout_s=30, in_passing=False, reads=True)
        st = json.loads(out) if out else {}
    except (TemporaryError, PermanentError, ValueError):
        return None
    if st.get("status") == "error":
        return "; ".join(str(e) for e in st.get("errors") or []) or "cloud-init failed"
    return None


def _last_boot(log_text: str) -> list[str]:
    """The lines of ``/var/log/cloud-init-output.log`` written by the last boot (cloud-init ends
    each boot's output with a "… finished at …" line)."""
    lines = [ln for ln in log_text.splitlines() if ln.strip()]
    ends = [i for i, ln in enumerate(lines) if "finished at" in ln]
    if not ends:
        return lines
    start = ends[-2] + 1 if len(ends) > 1 else 0
    return lines[start:ends[-1]]


async def _boot_log(ctx: JobContext, vm: VmState) -> list[str]:
    try:
        _, out, _ = await ctx.pve.agent_exec(vm.node, vm.vmid, ["cat", "/var/log/cloud-init-output.log"], timeout_s=30,
                                             reads=True)
    except (TemporaryError, PermanentError):
        return []
    return _last_boot(out)


async def join_token_refused(ctx: JobContext, vm: VmState) -> bool:
    """Whether the member's last boot's ``kubeadm join`` was refused for its token, as its own
    output log says (kubeadm's discovery: no JWS signature for the token ID — unknown or expired)."""
    return any(_TOKEN_REFUSED.search(ln) for ln in await _boot_log(ctx, vm))


async def read_nodes(ctx: JobContext, world: World) -> tuple[dict[str, bool] | None, str | None]:
    """The nodes the cluster's API reports (name -> Ready), asked inside the first running
    control plane whose API answers; (None, None) when none does."""
    cps = sorted((m for m in world.vms if m.startswith("cp-")), key=ordinal_key)
    for member in cps:
        vm = world.vms[member]
        if not vm.running:
            continue
        try:
            code, out, _ = await ctx.pve.agent_exec(vm.node, vm.vmid, ["kubectl", *ADMIN, "get", "nodes", "-o", "json"],
                                                    timeout_s=30, reads=True)
        except (TemporaryError, PermanentError):
            continue  # agent not up yet, VM gone meanwhile
        if code != 0:
            continue
        try:
            items = json.loads(out).get("items", [])
        except ValueError:
            continue
        nodes = {}
        for it in items:
            conds = {c.get("type"): c.get("status") for c in (it.get("status") or {}).get("conditions") or []}
            nodes[it["metadata"]["name"]] = conds.get("Ready") == "True"
        return nodes, member
    return None, None


# ================================================================ plan (pure)

def plan(job: Job, world: World) -> list[Step]:
    if world.superseded or world.cluster is None:
        return []
    desired = {m.name for m in world.desired}
    nodes = world.nodes or {}
    steps: list[Step] = []
    init = world.nodes is None and "cp-0" in desired
    if init:
        steps.append(INIT.step({"member": "cp-0"}).explained(drift=[Drift("api", "answers", None)]))
    for vm in world.vms.values():
        guard.refuse_platform(world.cluster.id, vm)
    for member in sorted(world.failed_boot, key=ordinal_key):
        if member in nodes:  # it joined before its cloud-init failed: out of the cluster first
            if member.startswith("cp-"):
                raise PermanentError(f"member {member} is a node of the cluster but its cloud-init failed "
                                     f"({world.failed_boot[member]}); a control plane (an etcd member) is not "
                                     "replaced automatically: an operator must look at it")
            steps.append(DRAIN.step({"member": member}))
        steps.append(REPLACE.step({"member": member, "cloud_init": world.failed_boot[member]}).explained(
            drift=[Drift(f"members.{member}.cloud_init", "done", world.failed_boot[member])]))
    joining = [m.name for m in world.desired
               if (not nodes.get(m.name) or m.name in world.failed_boot) and not (init and m.name == "cp-0")]
    # (the init and join steps' own VM plans put the filter of the members they provision on)
    unfiltered = [m for m in world.unfiltered if m in desired and m not in joining and not (init and m == "cp-0")]
    if unfiltered:
        steps.insert(0, FIREWALL.step({"members": unfiltered}))
    if joining:
        steps.append(JOIN.step({"members": joining}).explained(
            "make " + ", ".join(joining) + " Ready nodes (a stopped member is started: it was a node before; a new "
            "one is cloned, booted with its bootstrap ISO and joined)",
            [Drift(f"members.{m}.ready", True, nodes.get(m) if world.nodes is not None else None) for m in joining]
            + [Drift(f"members.{m}.power", "running", world.vms[m].status) for m in joining
               if m in world.vms and not world.vms[m].running]))
    extra = sorted({m for m in world.vms if m not in desired} | {n for n in nodes if n not in desired},
                   key=ordinal_key, reverse=True)
    for member in extra:
        gone = [Drift(f"members.{member}", None, "node" if member in nodes else "vm")]
        steps.append(DRAIN.step({"member": member}).explained(drift=gone))
        steps.append(REMOVE.step({"member": member}).explained(drift=gone))
    for vm in world.clones:  # half-made VMs of members no longer desired
        vms.refuse_if_locked(vm)  # a clone still being made: wait for it (Snooze), then remove it
        guard.guard_own_clone(world.cluster.id, vm)
        steps.append(REMOVE_CLONE.step({"vmid": vm.vmid, "node": vm.node}))
    down = [m for m in world.client_ca_unreachable if m in desired]
    if down:  # a rotation is done only when every API server trusts the new CA alone
        raise TemporaryError(f"credentials rotation: control plane {', '.join(down)} is not running; its API "
                             "server would still accept kubeconfigs minted before the rotation")
    stale = [m for m in world.client_ca_stale if m in desired and m not in joining]
    if stale:  # a credentials rotation: the new users' client CA to every running API server
        steps.append(PUSH_CLIENT_CA.step({"members": stale}))
    holding = [m for m, vm in world.vms.items()
               if m in desired and nodes.get(m) and m not in joining and _bootstrap_volume(vm)]
    if holding:
        steps.append(DETACH_BOOTSTRAP.step({"members": sorted(holding, key=ordinal_key)}))
    # Bootstrap ISOs (keys, a token) no member will boot from: of a member no longer desired (its
    # removal cut short between the VM's destroy and the ISO's), or of a Ready member but not the
    # one attached to it (an earlier attempt's, built with a token since replaced).
    attached = {_bootstrap_volume(vm) for vm in world.vms.values()}
    stray = [(n, v) for n, v in world.isos
             if v not in attached and ((iso_member(world.cluster.id, v) or "") not in desired
                                       or (nodes.get(iso_member(world.cluster.id, v) or "")
                                           and iso_member(world.cluster.id, v) not in joining))]
    if stray:
        steps.append(DELETE_ISOS.step({"isos": [list(i) for i in stray]}))
    return steps


def _bootstrap_volume(vm: VmState) -> str | None:
    """The bootstrap ISO's volid attached to ``vm``, or None."""
    val = str(vm.config.get(BOOTSTRAP_DRIVE) or "")
    volid = val.split(",", 1)[0]
    return volid if "iso/z9-" in volid else None


# ================================================================ apply

async def _init(ctx: JobContext, world: World, step: Step) -> None:
    await provision(ctx, world, _spec(world, "cp-0"), init=True)


async def _join(ctx: JobContext, world: World, step: Step) -> None:
    await _join_all(ctx, world, step.detail["members"])


async def _drain_step(ctx: JobContext, world: World, step: Step) -> None:
    await _drain(ctx, world, step.detail["member"])


async def _remove_member(ctx: JobContext, world: World, step: Step, *, for_good: bool) -> None:
    assert world.cluster is not None
    await _remove(ctx, world, step, step.detail["member"])
    if for_good:  # its VM gone for good: its private address too (a replaced one keeps it)
        await vms.release_private_address(ctx, world.cluster.id, step.detail["member"])
    world.vms.pop(step.detail["member"], None)
    if world.nodes is not None:  # drained and deleted before (or never a node): a new instance joins afresh
        world.nodes.pop(step.detail["member"], None)


async def _remove_step(ctx: JobContext, world: World, step: Step) -> None:
    await _remove_member(ctx, world, step, for_good=True)


async def _replace_step(ctx: JobContext, world: World, step: Step) -> None:
    # the VM goes; the join step makes a new one
    await _remove_member(ctx, world, step, for_good=False)


async def _firewall(ctx: JobContext, world: World, step: Step) -> None:
    await converge_firewalls(ctx, world, step, step.detail["members"])


async def converge_firewalls(ctx: JobContext, world: World, step: Step, members: list[str]) -> None:
    """The VM firewall (and IP filter) of each of ``members`` as its spec wants it now, with every
    member's address known so far in its rules: run before a member joins (the control planes'
    etcd must accept a joining control plane) and for members that drifted."""
    assert world.cluster is not None
    have = await store.vm_private_addresses_of(ctx.pool, world.cluster.id)
    for member in members:
        if member not in world.vms:
            continue
        m = _spec(world, member)
        private = vms.private_address_at(ctx, have[member]) if member in have else None
        vm = await ctx.pve.vm_state(world.vms[member].node, world.vms[member].vmid)
        if vm is None:
            continue
        vms.refuse_platform(world.cluster.id, vm)
        vms.refuse_if_locked(vm)
        spec = vm_spec(world.cluster, m, private, have)
        fw = await vms.observe_firewall(ctx, spec, vm)
        if vms.firewall_drift(spec, vm, fw):
            await vms.apply_firewall(ctx, spec, vm, step, fw)


async def _remove_clone(ctx: JobContext, world: World, step: Step) -> None:
    assert world.cluster is not None
    for kind in (vms.STOP, vms.DESTROY):
        await vms.apply_removal_step(ctx, world.cluster.id, kind.step({**step.detail, "untagged": True}))


async def _push_client_ca(ctx: JobContext, world: World, step: Step) -> None:
    # kube-apiserver reloads --client-ca-file when it changes, kube-controller-manager its
    # signers' cert/key files (DynamicCertKeyPairContent): no restart. The key first, then the
    # crt (a pair that does not match is not loaded: the signer keeps the old one meanwhile),
    # the bundle last. The key goes only where its file exists (cloud-init wrote it 0600;
    # file-write truncates an existing file and keeps its mode): never a new file of unknown mode.
    assert world.client_ca_bundle is not None and world.client_ca is not None
    crt, key = world.client_ca
    for member in step.detail["members"]:
        vm = world.vms[member]
        await ctx.fence()
        if member in world.client_ca_signers:
            await ctx.pve.agent_file_write(vm.node, vm.vmid, pki.CLIENT_CA_KEY, key.encode())
            await ctx.pve.agent_file_write(vm.node, vm.vmid, pki.CLIENT_CA_CRT, crt.encode())
        await ctx.pve.agent_file_write(vm.node, vm.vmid, pki.CLIENT_CA_BUNDLE, world.client_ca_bundle.encode())


async def _delete_isos(ctx: JobContext, world: World, step: Step) -> None:
    for node, volid in step.detail["isos"]:
        await delete_iso(ctx, node, volid, step)


async def _detach_bootstrap(ctx: JobContext, world: World, step: Step) -> None:
    assert world.cluster is not None
    for member in step.detail["members"]:
        # its config (the drive, the digest): a CD-ROM is set to none whatever the power state
        vm = await ctx.pve.vm_state(world.vms[member].node, world.vms[member].vmid, status=False)
        if vm is not None:
            await detach_bootstrap(ctx, world.cluster, vm, Step(f"detach {member}"))


#: the cluster's steps: run(ctx, world, step)
INIT = StepKind("init", _init, why="initialize the cluster on cp-0 (kubeadm init): no control plane answers")
JOIN = StepKind("join", _join, why="make the members Ready nodes")
DRAIN = StepKind("drain", _drain_step, disruptive=True, why="drain the member's node (its pods are evicted)")
REMOVE = StepKind("remove", _remove_step, disruptive=True, why="delete the member's node and destroy its VM")
REPLACE = StepKind("replace", _replace_step, disruptive=True,
                   why="replace the member's VM (its cloud-init failed): destroyed, made again")
FIREWALL = StepKind("firewall", _firewall, why="put the members' VM firewalls as z9 keeps them")
REMOVE_CLONE = StepKind("remove_clone", _remove_clone, why="remove a half-made clone of a member no longer desired")
PUSH_CLIENT_CA = StepKind("push_client_ca", _push_client_ca, why="give the API servers the rotated client CA")
DELETE_ISOS = StepKind("delete_isos", _delete_isos, why="delete bootstrap ISOs no member boots from")
DETACH_BOOTSTRAP = StepKind("detach_bootstrap", _detach_bootstrap,
                            why="eject the bootstrap ISO (keys, a token) from Ready members")
STEPS = StepKinds(INIT, JOIN, DRAIN, REMOVE, REPLACE, FIREWALL, REMOVE_CLONE, PUSH_CLIENT_CA, DELETE_ISOS,
                  DETACH_BOOTSTRAP)


async def apply(ctx: JobContext, world: World, step: Step) -> None:
    assert world.cluster is not None
    await STEPS.of(step, ctx.job.kind).run(ctx, world, step)


def _spec(world: World, member: str) -> MemberSpec:
    for m in world.desired:
        if m.name == member:
            return m
    raise PermanentError(f"member {member} is not part of the desired cluster")


async def _join_all(ctx: JobContext, world: World, members: list[str]) -> None:
    """Every member in parallel (each: VM, token, ISO, start, Ready); the first failure — a
    permanent one first — is raised once all have ended, naming every member that failed."""
    specs = [_spec(world, m) for m in members]
    # every joiner's address first, then the members already there accept them all — once, before
    # any joins (a joining control plane's etcd peers, the pod network); never one rewrite per joiner
    # racing the others' on the same VM
    for s in specs:
        await member_private_address(ctx, world, s)
    await converge_firewalls(ctx, world, Step("firewall"), [n for n in world.vms if n not in members])
    results = await asyncio.gather(*(provision(ctx, world, s, init=False) for s in specs), return_exceptions=True)
    failed = [(s.name, r) for s, r in zip(specs, results) if isinstance(r, BaseException)]
    if not failed:
        return
    for _, r in failed:
        if isinstance(r, (asyncio.CancelledError, Cancelled)):
            raise r
    perm = [(n, r) for n, r in failed if isinstance(r, PermanentError)]
    chosen = perm or failed
    msg = "; ".join(str(r) for _, r in chosen)
    if perm:
        raise PermanentError(msg)
    if all(isinstance(r, TemporaryError) for _, r in chosen):
        raise TemporaryError(msg)
    raise chosen[0][1]


async def provision(ctx: JobContext, world: World, m: MemberSpec, *, init: bool) -> None:
    """Make member ``m`` a Ready node: its VM (the VM machinery's clone ladder), its bootstrap ISO
    (token registered first for a joiner), started, verified inside, ISO detached and deleted."""
    cluster = world.cluster
    assert cluster is not None
    private = await member_private_address(ctx, world, m)
    step = Step(f"member {m.name}")
    # its own VM comes with every member's address known (the members already there were given the
    # joiners' before: _join_all)
    spec = vm_spec(cluster, m, private, await store.vm_private_addresses_of(ctx.pool, cluster.id))
    mw = await vms.observe_member(ctx, spec)
    for s in vms.plan_member(spec, mw, region=ctx.job.region):
        if s.name != "start":
            await vms.apply_member_step(ctx, spec, mw, s)
    vm = await ctx.pve.vm_state(mw.vm.node, mw.vm.vmid) if mw.vm is not None else None
    if vm is None:
        raise TemporaryError(f"member {m.name}: its VM is not there yet")
    # A member that was a node before (stopped since) is only started: its instance already ran
    # its bootstrap (same instance-id); a first boot gets its ISO (a joiner: a fresh token first).
    known = (init and cluster.initialized_at is not None) or (world.nodes is not None and m.name in world.nodes)
    if not vm.running and not known:
        token = None if init else await _token(ctx, world, m)
        volid = await _ensure_iso(ctx, cluster, m, vm, token, step, private)
        vm = await ctx.pve.vm_state(vm.node, vm.vmid) or vm
        vm = await _attach_seed(ctx, vm, volid, step)
    booting_since = None if vm.running else time.monotonic()  # a boot this attempt starts is measured
    if not vm.running:
        await vms.ensure_running(ctx, step, vm)
    for rejoins in range(MAX_REJOINS + 1):
        try:
            await wait_ready(ctx, world, m, vm)
            break
        except JoinTokenRefused as e:
            if init or rejoins == MAX_REJOINS:
                raise PermanentError(f"{e} (re-joined {rejoins} times)") from e
            booted_s = await _boot_took_s(ctx, vm, booting_since)
            vm = await _rejoin(ctx, world, m, vm, step, str(e), ttl_s=join_ttl_s(ctx, booted_s))
            booting_since = time.monotonic()
    vm = await ctx.pve.vm_state(vm.node, vm.vmid, status=False) or vm  # its config (the drive, the digest)
    await detach_bootstrap(ctx, cluster, vm, step)


def pve_cloudinit_drives(vm: VmState) -> list[str]:
    """The config keys of Proxmox's own cloud-init drive(s) on ``vm`` (``<storage>:vm-<vmid>-cloudinit``:
    a template's drive travels with its clones)."""
    return sorted(k for k, v in vm.config.items()
                  if re.fullmatch(r"(ide|sata|scsi)\d+", k) and re.search(r":(vm-\d+-)?cloudinit\b", str(v)))


async def _attach_seed(ctx: JobContext, vm: VmState, volid: str, step: Step) -> VmState:
    """The member's only seed is its bootstrap ISO on ``ide0``: Proxmox's own cloud-init drive (a
    second ``cidata`` device, which cloud-init's NoCloud may pick instead — its search sorts the
    candidate devices in reverse) is removed in the same config write. Proxmox's drive is the one
    that goes, not z9's ISO: the bootstrap (write_files, runcmd) cannot be put on Proxmox's drive
    through the API (``cicustom`` needs a snippets file, which the storage upload API does not
    take), and what that drive would add — ``ip=dhcp`` and the VM's name as hostname — is
    cloud-init's own fallback network and the ISO's ``hostname``."""
    drop = pve_cloudinit_drives(vm)
    if str(vm.config.get(BOOTSTRAP_DRIVE) or "").split(",", 1)[0] == volid and not drop:
        return vm
    params: dict[str, Any] = {BOOTSTRAP_DRIVE: f"{volid},media=cdrom"}
    if drop:
        params["delete"] = ",".join(drop)
    await ctx.fence()
    await ctx.wait_task(step, await ctx.pve.configure(vm.node, vm.vmid, params, digest=vm.config.get("digest")))
    # the config as written (its new digest); no power state: the caller starts the VM, and the start
    # task answers "already running" for a VM someone else started (vms.ensure_running), as a read would
    return await ctx.pve.vm_state(vm.node, vm.vmid, status=False) or vm


def join_ttl_s(ctx: JobContext, booted_s: float) -> float:
    """The life of a token minted again for a member whose join it refused: long enough for the boot z9
    measured (``booted_s``: from its start to the refusal — the boot, cloud-init and the join's own
    retries, an upper bound) twice over, on top of ``cluster_join_token_ttl_s`` — a guest that boots
    slower than a token lives would otherwise outlive every re-minted token alike."""
    return ctx.settings.cluster_join_token_ttl_s + 2.0 * max(0.0, booted_s)


async def _boot_took_s(ctx: JobContext, vm: VmState, since: float | None) -> float:
    """How long the member's boot took until its join was refused: since this attempt started or
    rebooted it, else its uptime (a boot an earlier attempt started)."""
    if since is not None:
        return time.monotonic() - since
    st = await ctx.pve.vm_state(vm.node, vm.vmid)
    return float(st.uptime_s or 0) if st is not None else 0.0


async def _rejoin(ctx: JobContext, world: World, m: MemberSpec, vm: VmState, step: Step, why: str, *,
                  ttl_s: float | None = None) -> VmState:
    """The member's join was refused for its token (it booted after the token's lifetime): a new
    token minted and registered (living ``ttl_s``: the boot time z9 measured, :func:`join_ttl_s`), a
    new ISO with it (a new instance-id: cloud-init runs the bootstrap again) swapped in for the old
    one, which is deleted, and the VM rebooted."""
    cluster = world.cluster
    assert cluster is not None
    log.info("cluster %s: %s — minting a new join token (living %.0fs) and joining again", cluster.id, why,
             ttl_s or ctx.settings.cluster_join_token_ttl_s)
    old = _bootstrap_volume(vm)
    token = await _token(ctx, world, m, fresh=True, ttl_s=ttl_s)
    volid = await _ensure_iso(ctx, cluster, m, vm, token, step, await member_private_address(ctx, world, m))
    vm = await _attach_seed(ctx, await ctx.pve.vm_state(vm.node, vm.vmid) or vm, volid, step)
    if old and old != volid:
        await delete_iso(ctx, vm.node, old, step)
    await ctx.fence()
    await ctx.wait_task(step, await ctx.pve.reboot(vm.node, vm.vmid))
    return await ctx.pve.vm_state(vm.node, vm.vmid) or vm


class JoinTokenRefused(TemporaryError):
    """kubeadm join was refused for the member's token (its own output log says so)."""


def token_clock() -> float:
    """Wall-clock seconds a join token's age is measured in (its memo's ``minted_at``: the memo
    outlives the attempt and the executor). Tests replace it to age a token without waiting."""
    return time.time()


async def _token(ctx: JobContext, world: World, m: MemberSpec, *, fresh: bool = False,
                 ttl_s: float | None = None) -> str:
    """The member's join token: remembered (memo, with its ttl) before it is registered on a control
    plane; replaced when older than half its ttl, or when ``fresh`` (the guest reported the join refused
    it: then it lives ``ttl_s``, else ``cluster_join_token_ttl_s``)."""
    key = f"token:{m.name}"  # one memo key per member: parallel members' writes never overwrite each other
    got = ctx.memo.get(key)
    now = token_clock()
    cluster_id = ctx.job.resource_id or ""
    token = open_join_token(ctx, cluster_id, m.name, got) if got is not None else None
    ttl = float((got or {}).get("ttl_s") or ctx.settings.cluster_join_token_ttl_s)
    if token is None or fresh or now - float(got["minted_at"]) > ttl / 2:
        ttl = ttl_s if fresh and ttl_s else ctx.settings.cluster_join_token_ttl_s
        token = pki.new_bootstrap_token()
        got = {**seal_join_token(ctx, cluster_id, m.name, token), "minted_at": now, "ttl_s": ttl}
        await ctx.remember(**{key: got})
    cp = await _api_vm(ctx, world)
    code, out, err = await ctx.pve.agent_exec(cp.node, cp.vmid, ["kubeadm", "token", "create", token, "--ttl",
                                                                 f"{int(ttl)}s", "--description",
                                                                 f"z9 join of {m.name}"], timeout_s=60)
    if code != 0 and "already exists" not in err:
        raise TemporaryError(f"member {m.name}: registering its join token on {cp.config.get('name')} failed: "
                             f"{err.strip() or out.strip()}")
    return token


def _join_key(ctx: JobContext) -> pki.InstallationKey:
    if ctx.settings.installation_key is None:
        raise PermanentError("Z9_INSTALLATION_KEY is not set on the executor: join tokens cannot be sealed")
    try:
        return pki.InstallationKey.parse(ctx.settings.installation_key.get_secret_value())
    except pki.SealError as e:
        raise PermanentError(str(e)) from e


def seal_join_token(ctx: JobContext, cluster_id: str, member: str, token: str) -> dict[str, str]:
    """The memo entry of a join token: sealed like the cluster's keys (AES-256-GCM with the
    installation key, bound to the cluster and member), never in clear in ``jobs.memo``."""
    key_id, nonce, sealed = _join_key(ctx).seal(f"{cluster_id}/join/{member}", {"token": token})
    return {"key_id": key_id, "nonce": base64.b64encode(nonce).decode(), "sealed": base64.b64encode(sealed).decode()}


def open_join_token(ctx: JobContext, cluster_id: str, member: str, entry: dict[str, Any]) -> str | None:
    """The join token of a memo entry; None when it cannot be opened (another installation key):
    a fresh one is minted then."""
    if "sealed" not in entry:
        return None  # written in clear by an earlier version: replaced by a sealed one
    try:
        return str(_join_key(ctx).open(f"{cluster_id}/join/{member}", entry["key_id"],
                                       base64.b64decode(entry["nonce"]), base64.b64decode(entry["sealed"]))["token"])
    except (pki.SealError, ValueError, KeyError):
        return None


async def _api_vm(ctx: JobContext, world: World) -> VmState:
    """A running control plane whose API answers (re-read each time: cp-0 may have just come up)."""
    if world.api_member is None or world.api_member not in world.vms:
        cluster = world.cluster
        assert cluster is not None
        world.vms.update({vms.member_of(v): v for v in await vms.find_vms(ctx, cluster.id)})
        world.nodes, world.api_member = await read_nodes(ctx, world)
    if world.api_member is None:
        raise TemporaryError("no control plane of the cluster answers yet")
    return world.vms[world.api_member]


def kubeadm_api_version(version: str) -> str:
    """The kubeadm config API a Kubernetes minor reads for ``init``/``join`` (kubeadm's
    ``validateSupportedVersion``, cmd/kubeadm/app/util/config/common.go): ``v1beta4`` from 1.31 (in
    1.28-1.30 it is experimental and refused by init/join), ``v1beta3`` before (deprecated from 1.31)."""
    minor = int(str(version).split(".")[1])
    return "kubeadm.k8s.io/v1beta4" if minor >= 31 else "kubeadm.k8s.io/v1beta3"


def controller_manager_signing_args(signing_duration_s: int) -> dict[str, str]:
    """kube-controller-manager's CSR signers (ClusterConfiguration.controllerManager.extraArgs).

    kubeadm starts it with ``--cluster-signing-{cert,key}-file`` = the cluster CA (kubeadm
    ``getControllerManagerCommand``), so the CSR API would sign a ``kubernetes.io/kube-apiserver-
    client`` certificate with the cluster CA, for ``--cluster-signing-duration`` (default 1 year): a
    cluster-admin approving its own CSR would get a credential that neither the kubeconfig expiry cap
    nor a rotation of the users' client CA touches. Instead every signer gets its own pair
    (kube-controller-manager ``--cluster-signing-<signer>-{cert,key}-file``): the users' client CA
    (:data:`pki.CLIENT_CA_CRT`, rotatable; the signer reloads the files when they change —
    ``newCAProvider``, DynamicCertKeyPairContent) for kube-apiserver-client; the cluster CA, as
    before, for the kubelets' client and serving certificates and legacy-unknown. The single pair is
    emptied (kube-controller-manager refuses it beside any per-signer file: ``cannot specify
    --cluster-signing-{cert,key}-file and other --cluster-signing-*-file flags at the same time``,
    cmd/kube-controller-manager/app/options/csrsigningcontroller.go; an empty value is how kubeadm
    itself turns a default off). ``--cluster-signing-duration`` is capped at ``signing_duration_s``
    (Z9_KUBECONFIG_MAX_EXPIRY_S): it is the longest any signer gives, so the kubelets' client
    certificates last as long at most — kubeadm's kubelets rotate theirs (``rotateCertificates``)."""
    ca, key = "/etc/kubernetes/pki/ca.crt", "/etc/kubernetes/pki/ca.key"
    args = {"cluster-signing-cert-file": "", "cluster-signing-key-file": "",
            "cluster-signing-kube-apiserver-client-cert-file": pki.CLIENT_CA_CRT,
            "cluster-signing-kube-apiserver-client-key-file": pki.CLIENT_CA_KEY}
    for signer in ("kubelet-client", "kubelet-serving", "legacy-unknown"):
        args[f"cluster-signing-{signer}-cert-file"] = ca
        args[f"cluster-signing-{signer}-key-file"] = key
    hours, rest = divmod(int(signing_duration_s), 3600)
    args["cluster-signing-duration"] = f"{hours}h{rest // 60}m{rest % 60}s"  # a Go duration
    return args


def _extra_args(api: str, args: dict[str, str]) -> list[dict[str, str]] | dict[str, str]:
    """extraArgs: v1beta4 a list of {name, value}, v1beta3 a map (kubeadm's API reference)."""
    return [{"name": k, "value": v} for k, v in args.items()] if api.endswith("v1beta4") else dict(args)


def cluster_release(settings: Any, cluster: Cluster) -> str:
    """The Kubernetes release of the cluster's image (``MAJOR.MINOR.PATCH``), from the region's
    catalogue (``kubernetes_images``, the API picked the image by it): kubeadm's
    ``kubernetesVersion`` and what every member's kubeadm and kubelet must say. A permanent error
    when the executor's catalogue names none for the image, or one of another minor."""
    region = settings.regions.get(cluster.region)
    release = region.kubernetes_images.get(cluster.image) if region is not None else None
    if release is None or release.rsplit(".", 1)[0] != cluster.version:
        why = f"carries Kubernetes {release}" if release else "has no Kubernetes release in the catalogue"
        raise PermanentError(f"cluster {cluster.id} (Kubernetes {cluster.version}): its image {cluster.image!r} {why} "
                             f"(Z9_REGIONS[{cluster.region}].kubernetes_images)")
    return release


def bootstrap_files(cluster: Cluster, material: dict[str, str], m: MemberSpec, token: str | None,
                    *, signing_duration_s: int = 86400, release: str | None = None) -> dict[str, str]:
    """``user-data`` and ``meta-data`` of member ``m`` (deterministic for one token).

    - cp-0 (``token`` None): the cluster's PKI, ``kubeadm init``; its kube-vip static pod mounts
      ``super-admin.conf`` (1.29+: ``admin.conf``'s user is made cluster-admin only at the end of
      init, and kube-vip must hold the VIP before that — kube-vip#684) and is switched to
      ``admin.conf`` once init has finished (the break-glass credential is not kept in a pod).
    - another control plane: the PKI, ``kubeadm join`` with ``controlPlane``; its kube-vip manifest
      is put in place after the join (``admin.conf`` exists only then: a missing hostPath file
      would become an empty directory).
    - a worker: no PKI file at all — ``kubeadm join``'s preflight refuses an existing
      ``/etc/kubernetes/pki/ca.crt`` (``FileAvailable--etc-kubernetes-pki-ca.crt``) and the CA hash
      in ``caCertHashes`` authenticates the CA discovery fetches.
    ``kubernetesVersion`` is ``release``, the image's own (:func:`cluster_release`; without one, the
    minor's .0). The config's apiVersion is the one the cluster's minor reads (:func:`kubeadm_api_version`); the
    pod subnet is the pinned pod network's (:data:`POD_NETWORK`). With a users' client CA, every
    control plane holds it (crt and key) for kube-controller-manager's kube-apiserver-client signer
    (:func:`controller_manager_signing_args`, ``signing_duration_s`` its longest certificate)."""
    endpoint = f"{_ip(cluster.endpoint_ip)}:6443"
    version = f"v{release or cluster.version + '.0'}"  # the image's release (:func:`cluster_release`)
    api = kubeadm_api_version(cluster.version)
    minor = int(str(cluster.version).split(".")[1])
    files: list[dict[str, str]] = []
    vip = _ip(cluster.endpoint_ip)
    if m.role == "control-plane":
        for name in ("ca.crt", "ca.key", "sa.key", "sa.pub", "front-proxy-ca.crt", "front-proxy-ca.key",
                     "etcd/ca.crt", "etcd/ca.key"):
            files.append({"path": f"/etc/kubernetes/pki/{name}", "content": material[name],
                          "permissions": "0600" if name.endswith(".key") else "0644"})
        files.append({"path": KUBE_VIP_STAGED, "permissions": "0600",
                      "content": yaml.safe_dump(_kube_vip(vip, ADMIN_CONF), sort_keys=False)})
        # the pod network's manifest: applied from here by the job, never fetched (POD_NETWORK)
        files.append({"path": POD_NETWORK["manifest"], "permissions": "0644",
                      "content": yaml.safe_dump_all(pod_network_manifest(), sort_keys=False)})
        if token is None:
            files.append({"path": KUBE_VIP_MANIFEST, "permissions": "0600", "content": yaml.safe_dump(
                _kube_vip(vip, SUPER_ADMIN_CONF if minor >= 29 else ADMIN_CONF), sort_keys=False)})
    bundle = pki.client_ca_bundle(material)
    if m.role == "control-plane" and bundle is not None:
        files.append({"path": pki.CLIENT_CA_BUNDLE, "content": bundle, "permissions": "0644"})
        files.append({"path": pki.CLIENT_CA_CRT, "content": material["client-ca.crt"], "permissions": "0644"})
        files.append({"path": pki.CLIENT_CA_KEY, "content": material["client-ca.key"], "permissions": "0600"})
    if token is None:
        cc: dict[str, Any] = {"apiVersion": api, "kind": "ClusterConfiguration", "clusterName": cluster.name,
                              "kubernetesVersion": version, "controlPlaneEndpoint": endpoint,
                              "networking": {"podSubnet": POD_NETWORK["pod_subnet"]}}
        if api.endswith("v1beta4"):
            cc["encryptionAlgorithm"] = "ECDSA-P256"  # a v1beta4 field (v1beta3 has none)
        if bundle is not None:  # users' kubeconfigs: their own CA, rotatable (see z9.common.pki)
            # extraArgs: v1beta4 a list of {name, value}, v1beta3 a map (kubeadm's API reference)
            cc["apiServer"] = {"extraArgs": _extra_args(api, {"client-ca-file": pki.CLIENT_CA_BUNDLE})}
            # the CSR API signs users' client certificates with the same rotatable CA, capped
            cc["controllerManager"] = {"extraArgs": _extra_args(api, controller_manager_signing_args(
                signing_duration_s))}
        docs = [{"apiVersion": api, "kind": "InitConfiguration", "nodeRegistration": {"name": m.name}}, cc]
        script = f"kubeadm init --config {KUBEADM_CONFIG} && cat {KUBE_VIP_STAGED} > {KUBE_VIP_MANIFEST}"
    else:
        join: dict[str, Any] = {"apiVersion": api, "kind": "JoinConfiguration",
                                "discovery": {"bootstrapToken": {"apiServerEndpoint": endpoint, "token": token,
                                                                 "caCertHashes": [pki.ca_cert_hash(material["ca.crt"])]}},
                                "nodeRegistration": {"name": m.name}}
        script = f"kubeadm join --config {KUBEADM_CONFIG}"
        if m.role == "control-plane":
            join["controlPlane"] = {}
            script += f" && cat {KUBE_VIP_STAGED} > {KUBE_VIP_MANIFEST}"
        docs = [join]
    files.append({"path": KUBEADM_CONFIG, "permissions": "0600", "content": yaml.safe_dump_all(docs, sort_keys=False)})
    user = {"hostname": member_hostname(cluster, m), "write_files": files, "runcmd": [["sh", "-c", script]]}
    # a new token is a new instance: a member re-joining with a re-minted token (its first join was
    # refused) boots its new ISO as a new instance, so cloud-init runs write_files and runcmd again
    iid = f"{cluster.id}-{m.name}" + (f"-{token.split('.')[0]}" if token else "")
    meta = {"instance-id": iid, "local-hostname": member_hostname(cluster, m)}
    return {"user-data": "#cloud-config\n" + yaml.safe_dump(user, sort_keys=False), "meta-data": yaml.safe_dump(meta)}


def _kube_vip(vip: str, kubeconfig: str) -> dict[str, Any]:
    """kube-vip's static pod (kube-vip docs, "Static Pods": ``kube-vip manifest pod --controlplane
    --arp --leaderElection``): host network, NET_ADMIN + NET_RAW (it adds the VIP to the NIC and
    sends gratuitous ARP), and the node's kubeconfig ``kubeconfig`` mounted where kube-vip reads it
    (``/etc/kubernetes/admin.conf``) for its leader election."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "kube-vip", "namespace": "kube-system"},
            "spec": {"hostNetwork": True, "containers": [{
                "name": "kube-vip", "image": KUBE_VIP_IMAGE, "imagePullPolicy": "IfNotPresent", "args": ["manager"],
                "env": [{"name": "address", "value": vip}, {"name": "port", "value": "6443"},
                        {"name": "vip_arp", "value": "true"}, {"name": "cp_enable", "value": "true"},
                        {"name": "cp_namespace", "value": "kube-system"},
                        {"name": "vip_leaderelection", "value": "true"}],
                "securityContext": {"capabilities": {"add": ["NET_ADMIN", "NET_RAW"]}},
                "volumeMounts": [{"mountPath": ADMIN_CONF, "name": "kubeconfig"}]}],
                # as kube-vip's generator writes it: its client reaches the local API server as "kubernetes"
                "hostAliases": [{"ip": "127.0.0.1", "hostnames": ["kubernetes"]}],
                "volumes": [{"name": "kubeconfig", "hostPath": {"path": kubeconfig}}]}}


def _ip(v: Any) -> str:
    return str(getattr(v, "ip", v))


async def material_of(ctx: JobContext, cluster: Cluster) -> dict[str, str]:
    """The cluster's PKI, opened with the installation key."""
    if ctx.settings.installation_key is None:
        raise PermanentError("Z9_INSTALLATION_KEY is not set on the executor: the cluster's keys cannot be opened")
    sealed = await cluster_store.cluster_keys_get(ctx.pool, cluster.id)
    if sealed is None:
        raise PermanentError(f"cluster {cluster.id} has no keys (destroyed)")
    try:
        return pki.InstallationKey.parse(ctx.settings.installation_key.get_secret_value()).open(cluster.id, *sealed)
    except pki.SealError as e:
        raise PermanentError(str(e)) from e


def iso_prefix(cluster_id: str) -> str:
    return f"z9-{cluster_id}-"


def iso_member(cluster_id: str, volid: str) -> str | None:
    """The member a bootstrap ISO of the cluster was built for (``…iso/z9-<cluster>-<member>-<hash16>.iso``)."""
    m = re.search(r"iso/" + re.escape(iso_prefix(cluster_id)) + r"(?P<member>[a-z0-9-]+)-[0-9a-f]{16}\.iso$", volid)
    return m["member"] if m else None


async def cluster_isos(ctx: JobContext, cluster_id: str) -> list[tuple[str, str]]:
    """The cluster's bootstrap ISOs on the bootstrap storage as each node sees it (a shared
    storage's file once, from the first node that sees it; a node-local one's on its node)."""
    storage = ctx.settings.cluster_bootstrap_storage
    prefix = f"{storage}:iso/{iso_prefix(cluster_id)}"
    out: list[tuple[str, str]] = []
    for node in sorted({v.node for v in await ctx.pve.list_vms()}):
        for volid in await ctx.pve.storage_isos(node, storage):
            if volid.startswith(prefix) and volid not in {v for _, v in out}:
                out.append((node, volid))
    return out


async def _ensure_iso(ctx: JobContext, cluster: Cluster, m: MemberSpec, vm: VmState, token: str | None,
                      step: Step, private: vms.PrivateAddress | None = None) -> str:
    """Build the member's ISO; upload it unless a file of that (content-addressed) name exists.
    Its network-config gives the member its address on the region's private network (``private``;
    else DHCP) and the region's DNS (:func:`network_config`)."""
    files = bootstrap_files(cluster, await material_of(ctx, cluster), m, token,
                            signing_duration_s=ctx.settings.kubeconfig_max_expiry_s,
                            release=cluster_release(ctx.settings, cluster))
    data = nocloud.build_nocloud_iso(user_data=files["user-data"], meta_data=files["meta-data"],
                                     network_config=network_config(vm, private, vms.guest_nameservers(ctx)))
    name = f"{iso_prefix(cluster.id)}{m.name}-{hashlib.sha256(data).hexdigest()[:16]}.iso"
    storage = ctx.settings.cluster_bootstrap_storage
    volid = f"{storage}:iso/{name}"
    if volid in await ctx.pve.storage_isos(vm.node, storage):
        return volid
    earlier = ctx.memo.get(f"upload:{name}")
    if earlier:  # an earlier attempt sent this very file: wait for its task rather than send it again
        try:
            await ctx.wait_task(step, earlier)
            if volid in await ctx.pve.storage_isos(vm.node, storage):
                return volid
        except (TemporaryError, PermanentError) as e:
            log.warning("cluster %s: the earlier upload of %s (%s) did not land: %s", cluster.id, name, earlier, e)
    await ctx.fence()
    upid = await ctx.pve.upload_iso(vm.node, storage, name, data)
    await ctx.remember(**{f"upload:{name}": upid})
    await ctx.wait_task(step, upid)
    return volid


async def wait_ready(ctx: JobContext, world: World, m: MemberSpec, vm: VmState) -> None:
    """Inside the guest: cloud-init done (its error text otherwise); a control plane's API
    ``/readyz`` ok; the member a Ready node."""
    deadline = time.monotonic() + ctx.settings.cluster_member_ready_s
    last = "its guest agent does not answer yet"
    while time.monotonic() < deadline:
        ctx.touch()
        await ctx.check_superseded()  # a member's wait is long: a DELETE ends it here too
        try:
            last = await _ready_once(ctx, world, m, vm)
            if last == "":
                return
        except JoinTokenRefused:
            raise
        except TemporaryError as e:
            last = str(e)
        await asyncio.sleep(0.3)
    raise TemporaryError(f"member {m.name} (VM {vm.vmid}) not Ready after {ctx.settings.cluster_member_ready_s:.0f}s: "
                         f"{last}")


async def _ready_once(ctx: JobContext, world: World, m: MemberSpec, vm: VmState) -> str:
    """'' when Ready, else what is still missing. Raises PermanentError when cloud-init failed."""
    # (polled while the guest boots: an agent not running yet answers at once, the loop asks again)
    code, out, err = await ctx.pve.agent_exec(vm.node, vm.vmid, ["cloud-init", "status", "--format", "json"],
                                              timeout_s=30, in_passing=False)
    try:
        st = json.loads(out) if out else {}
    except ValueError:
        st = {}
    status = st.get("status") or st.get("extended_status")
    if status == "error" or (code not in (0, 2) and not out):
        errors = "; ".join(str(e) for e in st.get("errors") or []) or err.strip()
        lines = await _boot_log(ctx, vm)
        tail = [ln for ln in lines if not ln.startswith("To see the stack trace")][-2:]
        what = (f"member {m.name} (VM {vm.vmid} on {vm.node}): cloud-init failed: {errors}"
                + (f" — {' / '.join(tail)}" if tail else ""))
        if any(_TOKEN_REFUSED.search(ln) for ln in lines):
            raise JoinTokenRefused(what)  # re-minted and joined again: its ISO is replaced then
        await _drop_failed_iso(ctx, vm)  # it holds a join token: gone from storage at once
        raise PermanentError(what)
    if status == "disabled" and _bootstrap_volume(vm):
        raise PermanentError(f"member {m.name} (VM {vm.vmid} on {vm.node}): cloud-init read no seed although "
                             f"{_bootstrap_volume(vm)} is attached: its bootstrap did not run")
    if status not in ("done", "disabled"):  # disabled: no seed at this boot (a member restarted after
        return f"cloud-init is {status}"     # its ISO was detached: its bootstrap ran at its first boot)
    if m.name not in world.dns_ok:  # its resolver, once per attempt: image pulls and the pod network need DNS
        resolv = await ctx.pve.agent_file_read(vm.node, vm.vmid, vms.RESOLV_CONF)
        if not vms.resolv_nameservers((resolv or b"").decode("utf-8", "replace")):
            raise PermanentError(f"member {m.name} (VM {vm.vmid} on {vm.node}): {vms.no_dns(vm.vmid)}")
        world.dns_ok.add(m.name)
    assert world.cluster is not None
    release = cluster_release(ctx.settings, world.cluster)
    if m.name not in world.kubeadm_ok:  # the image's kubeadm, once per attempt (its kubelet: the node's report)
        code, out, err = await ctx.pve.agent_exec(vm.node, vm.vmid, ["kubeadm", "version", "-o", "short"], timeout_s=30)
        if code != 0 or out.strip() != f"v{release}":
            raise PermanentError(_wrong_binary(world, m, vm, "kubeadm", (out or err).strip(), release))
        world.kubeadm_ok.add(m.name)
    if m.role == "control-plane":
        code, out, err = await ctx.pve.agent_exec(vm.node, vm.vmid, ["kubectl", *ADMIN, "get", "--raw", "/readyz"],
                                                  timeout_s=30)
        if code != 0 or out.strip() != "ok":
            return f"its API server is not ready ({(err or out).strip()})"
        world.api_member = world.api_member or m.name
        world.vms.setdefault(m.name, vm)
        if not world.pod_network:
            await _apply_pod_network(ctx, m, vm)
            world.pod_network = True
    cp = await _api_vm(ctx, world)
    code, out, err = await ctx.pve.agent_exec(cp.node, cp.vmid, ["kubectl", *ADMIN, "get", "nodes", "-o", "json"],
                                              timeout_s=30)
    if code != 0:
        world.api_member = None
        return f"the control plane does not answer ({err.strip()})"
    for it in json.loads(out).get("items", []):
        if it["metadata"]["name"] == m.name:
            kubelet = ((it.get("status") or {}).get("nodeInfo") or {}).get("kubeletVersion")
            if kubelet != f"v{release}":  # what the member's kubelet reports of itself (NodeSystemInfo)
                raise PermanentError(_wrong_binary(world, m, vm, "kubelet", str(kubelet), release))
            conds = {c.get("type"): c.get("status") for c in (it.get("status") or {}).get("conditions") or []}
            return "" if conds.get("Ready") == "True" else "its node is not Ready"
    return "it is not a node of the cluster yet"


def _wrong_binary(world: World, m: MemberSpec, vm: VmState, binary: str, found: str, release: str) -> str:
    """A member whose image does not carry the release its catalogue entry names: the cluster would
    run another Kubernetes than asked (kubeadm's own skew checks pass a patch or a minor apart)."""
    cluster = world.cluster
    assert cluster is not None
    return (f"member {m.name} (VM {vm.vmid} on {vm.node}): its {binary} is {found or 'missing'}, but its image "
            f"{cluster.image!r} is declared to carry Kubernetes v{release} (Z9_REGIONS[{cluster.region}]."
            "kubernetes_images): the image or the catalogue is wrong")


async def _apply_pod_network(ctx: JobContext, m: MemberSpec, vm: VmState) -> None:
    """``kubectl apply -f`` the pinned pod network's manifest — the file the control plane's seed
    wrote (:func:`pod_network_manifest`) — on a control plane whose API answers (idempotent:
    ``unchanged`` when it is there). The nodes are Ready only once it runs."""
    await ctx.fence()
    code, out, err = await ctx.pve.agent_exec(vm.node, vm.vmid, ["kubectl", *ADMIN, "apply", "-f",
                                                                 POD_NETWORK["manifest"]], timeout_s=120)
    if code != 0:
        raise TemporaryError(f"member {m.name}: applying the pod network ({POD_NETWORK['name']} "
                             f"{POD_NETWORK['version']}) failed: {(err or out).strip()}")


async def detach_bootstrap(ctx: JobContext, cluster: Cluster, vm: VmState, step: Step) -> None:
    """The member is Ready: its ISO (keys, a token) goes — the CD-ROM set to none, the file
    deleted, and with it any earlier ISO of the member's (built with a token since replaced)."""
    volid = _bootstrap_volume(vm)
    if volid is None:
        return
    await ctx.fence()
    await ctx.wait_task(step, await ctx.pve.configure(vm.node, vm.vmid, {BOOTSTRAP_DRIVE: "none,media=cdrom"},
                                                      digest=vm.config.get("digest")))
    member = vms.member_of(vm)
    storage = volid.split(":", 1)[0]
    listed = await ctx.pve.storage_isos(vm.node, storage)  # one listing for all of them
    for other in listed:
        if other != volid and iso_member(cluster.id, other) == member:
            await delete_iso(ctx, vm.node, other, step, listed=listed)
    await delete_iso(ctx, vm.node, volid, step, listed=listed)


async def _drop_failed_iso(ctx: JobContext, vm: VmState) -> None:
    """A member whose cloud-init failed will never read its ISO again (a re-run replaces it with a
    new instance and a fresh token): the file — its join token, a control plane's CA keys — is
    deleted from storage now, not left there with the failed VM. The drive keeps naming it: that
    is how a re-run knows the member was never confirmed (:func:`observe`)."""
    volid = _bootstrap_volume(vm)
    if volid is None:
        return
    try:
        await delete_iso(ctx, vm.node, volid, Step(f"delete the failed bootstrap ISO of VM {vm.vmid}"))
    except (TemporaryError, PermanentError) as e:  # the next run's plan deletes it (replace)
        log.warning("VM %s: could not delete its bootstrap ISO %s after cloud-init failed: %s", vm.vmid, volid, e)


async def delete_iso(ctx: JobContext, node: str, volid: str, step: Step, *, listed: list[str] | None = None) -> None:
    """Delete the ISO ``volid`` unless the storage does not hold it (``listed``: the storage's
    listing the caller has just read in this step, not read again)."""
    storage = volid.split(":", 1)[0]
    if volid not in (listed if listed is not None else await ctx.pve.storage_isos(node, storage)):
        return
    await ctx.fence()
    upid = await ctx.pve.delete_volume(node, storage, volid)
    if upid:
        await ctx.wait_task(step, upid)


async def _drain(ctx: JobContext, world: World, member: str) -> None:
    """Drain the member's node, then delete it from the cluster (through a control plane)."""
    try:
        cp = await _api_vm(ctx, world)
    except TemporaryError:
        if world.nodes is None:
            return  # no cluster API at all (a create that never initialised): nothing to drain
        raise
    if (world.nodes or {}).get(member) is None and member not in (world.nodes or {}):
        return
    await ctx.fence()
    code, out, err = await ctx.pve.agent_exec(cp.node, cp.vmid, ["kubectl", *ADMIN, "drain", member,
                                                                 "--ignore-daemonsets", "--delete-emptydir-data",
                                                                 "--timeout=300s"], timeout_s=330)
    if code != 0 and "not found" not in err:
        raise TemporaryError(f"draining {member} failed: {err.strip()}")
    code, out, err = await ctx.pve.agent_exec(cp.node, cp.vmid, ["kubectl", *ADMIN, "delete", "node", member],
                                              timeout_s=60)
    if code != 0 and "not found" not in err:
        raise TemporaryError(f"deleting node {member} failed: {err.strip()}")


async def _remove(ctx: JobContext, world: World, step: Step, member: str) -> None:
    """Stop and destroy the member's VM (the deletion guard re-applied right before), and its ISO."""
    cluster = world.cluster
    assert cluster is not None
    for vm in await vms.find_vms(ctx, cluster.id, member):
        guard.guard(cluster.id, vm)
        volid = _bootstrap_volume(vm)
        for kind in (vms.STOP, vms.DESTROY):
            if kind is vms.STOP and not vm.running:
                continue
            await vms.apply_removal_step(ctx, cluster.id, kind.step({"vmid": vm.vmid, "node": vm.node}))
        if volid:
            await delete_iso(ctx, vm.node, volid, step)


# ================================================================ verify / record

@dataclass
class Seen:
    members: list[dict[str, Any]]
    whole: bool
    missing: list[str]
    api: bool = True  # some control plane's API answered
    notes: dict[str, str] = field(default_factory=dict)  # member -> why it is not Ready, when known

    def reason(self) -> str | None:
        """Why the cluster is not whole (the ``degraded`` status' reason), or None."""
        if self.whole:
            return None
        if not self.api:
            return "no control plane's API answers (every member reported not Ready)"
        return "not a Ready node: " + ", ".join(f"{m} ({self.notes[m]})" if m in self.notes else m
                                                for m in self.missing)


async def verify(ctx: JobContext) -> Seen:
    world = await observe(ctx)
    if world.superseded or world.cluster is None:
        return Seen([], False, [])
    extra = [m for m in world.vms if m not in {d.name for d in world.desired}]
    if extra:
        raise TemporaryError("verify: members still to remove: " + ", ".join(sorted(extra)))
    if world.unfiltered:
        raise TemporaryError("verify: the firewall of " + ", ".join(world.unfiltered) + " is not as wanted yet")
    return await seen_of(ctx, world)


async def seen_of(ctx: JobContext, world: World) -> Seen:
    """Every desired member as observed: its VM (vmid, node, power, address from its agent) and
    whether it is a Ready node of the cluster (``missing``: those that are not, plus the reason
    when no control plane's API answers)."""
    nodes = world.nodes or {}
    members = []
    vms_of = [world.vms.get(m.name) for m in world.desired]

    async def no_address() -> None:
        return None

    # every member's address from its agent at once (a 3 + 30 cluster: one round trip's time, not 33)
    addresses = await asyncio.gather(*(_address(ctx, vm) if vm is not None and vm.running else no_address()
                                       for vm in vms_of))
    for m, vm, address in zip(world.desired, vms_of, addresses):
        members.append({"name": m.name, "role": m.role, "pool": m.pool, "ordinal": m.ordinal,
                        "vmid": vm.vmid if vm else None, "node": vm.node if vm else None, "address": address,
                        "power_state": ("running" if vm.running else "stopped") if vm else None,
                        "ready": bool(nodes.get(m.name))})
    missing = [m["name"] for m in members if not m["ready"]]
    notes = {m: f"cloud-init failed: {e}" for m, e in world.failed_boot.items()}
    notes.update({m["name"]: "stopped" for m in members if m["power_state"] == "stopped"})
    notes.update({m["name"]: "no VM" for m in members if m["vmid"] is None})
    return Seen(members, not missing, missing, api=world.nodes is not None, notes=notes)


async def _address(ctx: JobContext, vm: VmState) -> str | None:
    """The member's first IPv4 address as its guest agent reports it."""
    try:
        code, out, _ = await ctx.pve.agent_exec(vm.node, vm.vmid, ["ip", "-j", "addr"], timeout_s=30)
        for iface in json.loads(out) if code == 0 and out else []:
            if iface.get("ifname") == "lo":
                continue
            for a in iface.get("addr_info") or []:
                if a.get("family") == "inet":
                    return str(a.get("local"))
    except (TemporaryError, PermanentError, ValueError):
        return None
    return None


async def record_seen(conn: Any, ctx: JobContext, seen: Seen) -> None:
    """In the finishing transaction: members, and the status — ``running`` when every desired
    member is a Ready node, ``degraded`` otherwise (the API answers, a node is not Ready)."""
    if not seen.members:
        return
    await record_members(conn, ctx, seen, from_statuses=("creating", "updating", "running", "degraded", "failed"))


async def record_members(conn: Any, ctx: JobContext, seen: Seen, *, from_statuses: tuple[str, ...]) -> None:
    """Members and status (``running``/``degraded``, the latter with its reason), the status
    only from one of ``from_statuses``."""
    await cluster_store.cluster_members(conn, ctx.job.resource_id, seen.members, seen.whole)
    await CLUSTER.observed(conn, ctx.job.resource_id, status="running" if seen.whole else "degraded",
                           from_statuses=from_statuses)
    reason = seen.reason()
    if reason:
        await cluster_store.cluster_degraded_reason(conn, ctx.job.resource_id, reason)


async def record_failure(conn: Any, ctx: JobContext, error: dict[str, Any]) -> None:
    """A failed create: the cluster is ``failed``. A failed reconcile of a cluster that was once
    whole: ``degraded`` (its quorum may be fine) with the reason. A cancelled job (superseded by
    the delete) leaves the deletion going."""
    cluster = await CLUSTER.get(conn, ctx.job.resource_id)
    if cluster is not None and cluster.initialized_at is not None and cluster.status not in (
            "deleting", "destroying", "deleted") and error.get("class") != "cancelled":
        await cluster_store.cluster_degraded(conn, cluster.id, error["message"])
        return
    await CLUSTER.mark_failed_by_job(conn, ctx.job.resource_id, error["message"], kind=ctx.job.kind,
                                     refused=bool(error.get("refused")))


__all__ = ["observe", "plan", "apply", "verify", "record_seen", "record_failure", "identity_tag"]
