"""A kubeadm/kubectl model on the guest model (issue 11, made strict by issue 18): command handlers
for ``kubeadm`` and ``kubectl`` that run inside simulated guests (``agent/exec``, cloud-init ``runcmd``).

**This is a model, not kubeadm.** Load balancers are judged by the real ``haproxy -c``/``keepalived -t``
and user-data by the real ``cloud-init schema``; no real kubeadm can run here (it needs a kubelet,
a container runtime, etcd and root on a real host). So this module re-states kubeadm's documented
rules — each with the kubeadm source file or document it comes from, in a comment where it is
applied — and refuses what real kubeadm would refuse, with kubeadm's own error texts. What it
checks:

- **config ``apiVersion`` per Kubernetes minor** (``cmd/kubeadm/app/util/config/common.go``
  ``validateSupportedVersion``): ``kubeadm.k8s.io/v1beta3`` from 1.22, deprecated — a warning —
  from 1.31 (kubernetes/kubernetes#125029: "supported until version 1.34 or later") and removed in
  1.36 (kubernetes/kubernetes#136016: "The 1.35 kubeadm binary can be used to migrate");
  ``v1beta4`` experimental in 1.28–1.30 (refused by ``init``/``join``, which have no
  ``--allow-experimental-api``) and the current API from 1.31; ``v1beta2`` and older refused, by
  the node's own kubeadm.
- **the image's binaries and the version skew**: ``kubeadm``, ``kubelet`` and ``kubectl`` exist in a
  guest only when its disk's dpkg database holds their packages (an image builder installed them;
  a clone copies its template's disk), at the packages' versions (``kubeadm version``, ``kubelet
  --version``, a node's ``status.nodeInfo.kubeletVersion``). kubeadm refuses a control plane more
  than one minor behind it, warns of one newer than it, and its preflight refuses a kubelet newer
  than the control plane or more than three minors behind kubeadm (:func:`skew_problems`, citing
  constants.go, util/config/common.go and preflight/checks.go).
- **preflight** (``cmd/kubeadm/app/preflight/checks.go``): ``init`` — ``InitNodeChecks``: at least
  ``ControlPlaneNumCPU`` (2) CPUs and ``ControlPlaneMem`` (1700) MB of the guest kernel's RAM
  (``NumCPU``, ``Mem``; the VM's vCPUs and memory less what the kernel keeps), ports
  6443, 10259, 10257 (and 10250, 2379, 2380) free, the four control-plane static pod manifests
  absent (``FileAvailable--etc-kubernetes-manifests-*.yaml``), ``DirAvailable--var-lib-etcd``;
  ``join`` — ``JoinNodeChecks``: ``FileAvailable--etc-kubernetes-kubelet.conf``,
  ``FileAvailable--etc-kubernetes-bootstrap-kubelet.conf``, ``Port-10250`` and, for a node without
  ``controlPlane``, ``FileAvailable--etc-kubernetes-pki-ca.crt`` (the CA must NOT be pre-written:
  the ``caCertHashes`` pin authenticates the CA discovery fetches); then discovery, then for a
  control plane the init checks again (``isSecondaryControlPlane``) and its PKI. A port is "in use"
  when this guest already runs what kubeadm started there (an earlier init/join on this disk,
  guest up); ``--ignore-preflight-errors`` is honoured as ``RunChecks`` does.
- **discovery** (``cmd/kubeadm/app/discovery/token/token.go``): the API must answer at
  ``apiServerEndpoint``; a token unknown to the cluster *or past its expiry* has no JWS signature in
  ``cluster-info`` (the bootstrap signer signs only live tokens; the token cleaner deletes expired
  ones): "could not find a JWS signature in the cluster-info ConfigMap for token ID …"; the CA's
  SubjectPublicKeyInfo hash must be pinned. A token's expiry is what ``kubeadm token create --ttl``
  (or ``bootstrapTokens[].ttl``) gave it, on the simulator's wall clock.
- **the control-plane endpoint needs something holding it**: z9's endpoint is a VIP held by a
  kube-vip static pod (``/etc/kubernetes/manifests/kube-vip.yaml``, kube-vip's "static pods"
  docs). The endpoint answers only while a running control plane has a kube-vip manifest with
  ``hostNetwork: true``, ``securityContext.capabilities.add`` ⊇ ``NET_ADMIN``, ``NET_RAW`` (ARP
  and the VIP on the host NIC), the VIP as ``address``, and a kubeconfig mounted at
  ``/etc/kubernetes/admin.conf`` (kube-vip's default ``--k8sConfigPath``) from a ``hostPath`` file
  that exists on that node. On the node running ``kubeadm init`` of 1.29+ that file must be
  ``/etc/kubernetes/super-admin.conf``: ``admin.conf``'s user is bound to cluster-admin only by
  init itself, after the endpoint must already answer (kubernetes/kubernetes#121305,
  kube-vip/kube-vip#684), so init times out; ``super-admin.conf`` is written on that node only.
- **``Ready`` needs a pod network**: the kubelet reports ``NetworkReady=false`` ("cni plugin not
  initialized") until a CNI is installed: ``kubectl apply -f <file>`` of Flannel's manifest in the
  guest (:func:`flannel_in`: its release from the flanneld image, its network from
  ``net-conf.json``), or of a URL among :data:`CNI_MANIFESTS` (it fetches nothing; Flannel v0.26.1, whose ``net-conf.json`` network is
  ``10.244.0.0/16`` — it needs ``networking.podSubnet`` inside that network so that the
  controller-manager allocates each node a ``podCIDR``; otherwise flanneld fails "pod cidr not
  assigned" and the nodes stay NotReady).

What it cannot check: anything of a real host (kernel modules, sysctls, swap, the container
runtime, image pulls, cgroup drivers, certificate SANs and expiry beyond the CA key pair, etcd
quorum, RBAC beyond the super-admin rule, the CNI's data path); manifests it does not know are not
fetched (no Internet): ``kubectl apply -f`` of another URL fails naming the ones it knows.

Everything the model knows comes from the bytes z9 shipped — the kubeadm config file, the PKI and
manifest files written by cloud-init from the NoCloud ISO (``write_files``) or through the agent —
never from a test flag.

Clusters are keyed by their control-plane endpoint (``host:port``) and live in the simulator's
guest manager (one dict per simulator); the state is also visible in each member's guest model
``kubeadm`` (``GET /_sim/guests/{vmid}``: ``models.kubeadm``).

``kubeadm init --config F``
    F holds an ``InitConfiguration`` (``nodeRegistration.name``) and a ``ClusterConfiguration``
    (``controlPlaneEndpoint``, ``kubernetesVersion``, ``networking.podSubnet``). Needs
    ``/etc/kubernetes/pki/{ca.crt,ca.key,sa.key,sa.pub,front-proxy-ca.crt,front-proxy-ca.key,
    etcd/ca.crt,etcd/ca.key}`` (kubeadm's "external CA" mode: the orchestrator owns the PKI) and
    ``ca.key`` must match ``ca.crt``. The cluster's API comes up ``API_DELAY_S`` seconds later
    (:data:`SETTINGS`). Writes the static pod manifests, ``kubelet.conf``, ``admin.conf`` and (1.29+)
    ``super-admin.conf``.
``kubeadm join --config F``
    F holds a ``JoinConfiguration``: ``discovery.bootstrapToken.{apiServerEndpoint, token,
    caCertHashes}``, ``nodeRegistration.name`` and, for a control plane, ``controlPlane``.
``kubeadm token create <token> --ttl <dur>``
    (on a control plane) the cluster knows the token until now + ttl (Go duration: ``900s``,
    ``15m0s``). A token already known: exit 1 (``already exists``).
``kubectl [--kubeconfig F] get --raw /readyz`` → ``ok`` while the API is up; F other than
``admin.conf``/``super-admin.conf`` is a user's kubeconfig, whose client certificate the API server
authenticates (:func:`_client_refused`) against its ``--client-ca-file`` as that file is *now*;
``kubectl get nodes -o json`` → a NodeList (``Ready`` True while the node's guest is up and the
cluster has a pod network); ``kubectl apply -f <url>`` (a known CNI manifest);
``kubectl drain <node> …`` → cordoned + drained (recorded in the cluster's ``events``);
``kubectl delete node <node>``.

Faults: a member's cloud-init fails (the guest model's ``cloud_init_fails``); a token expires (its
ttl passes — z9 chose the ttl — or :func:`expire_tokens`, admin ``POST /_sim/k8s/expire-tokens``).
"""
from __future__ import annotations

import functools
import hashlib
import ipaddress
import json
import re
import time
from typing import Any

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from .guest import (
    PACKAGED,
    ExecContext,
    ExecResult,
    Guests,
    command,
    guest_cpus,
    guest_ram_mb,
    installed_version,
)

SETTINGS = {"api_delay_s": 1.0}
PKI_FILES = ("ca.crt", "ca.key", "sa.key", "sa.pub", "front-proxy-ca.crt", "front-proxy-ca.key", "etcd/ca.crt",
             "etcd/ca.key")
PKI = "/etc/kubernetes/pki/"
ADMIN_CONF = "/etc/kubernetes/admin.conf"
SUPER_ADMIN_CONF = "/etc/kubernetes/super-admin.conf"
KUBELET_CONF = "/etc/kubernetes/kubelet.conf"
BOOTSTRAP_KUBELET_CONF = "/etc/kubernetes/bootstrap-kubelet.conf"
MANIFESTS = "/etc/kubernetes/manifests/"
KUBE_VIP = MANIFESTS + "kube-vip.yaml"
ETCD_DATA = "/var/lib/etcd"
# kubeadm constants.go: KubeAPIServer, KubeControllerManager, KubeScheduler, Etcd static pods
CONTROL_PLANE_PODS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "etcd")
# constants.go: KubeletPort 10250; InitNodeChecks: LocalAPIEndpoint.BindPort (6443), KubeSchedulerPort
# 10259, KubeControllerManagerPort 10257, EtcdListenClientPort 2379, EtcdListenPeerPort 2380
NODE_PORTS = (10250,)
# constants.go: ControlPlaneNumCPU = 2 ("the number of CPUs required on control-plane") and
# ControlPlaneMem = 1700 ("the number of megabytes of memory required on the control-plane")
CONTROL_PLANE_NUM_CPU = 2
CONTROL_PLANE_MEM_MB = 1700
CONTROL_PLANE_PORTS = (6443, 10259, 10257, 2379, 2380)
# The pod networks the model knows (it fetches nothing): the manifest's URL → what it installs.
# Flannel v0.26.1's kube-flannel.yml: namespace kube-flannel, its RBAC, the kube-flannel-cfg
# ConfigMap (net-conf.json "Network": "10.244.0.0/16", backend vxlan) and the kube-flannel-ds DaemonSet.
CNI_MANIFESTS: dict[str, dict[str, Any]] = {
    "https://github.com/flannel-io/flannel/releases/download/v0.26.1/kube-flannel.yml": {
        "cni": "flannel", "version": "v0.26.1", "network": "10.244.0.0/16",
        "objects": ["namespace/kube-flannel", "serviceaccount/flannel",
                    "clusterrole.rbac.authorization.k8s.io/flannel",
                    "clusterrolebinding.rbac.authorization.k8s.io/flannel", "configmap/kube-flannel-cfg",
                    "daemonset.apps/kube-flannel-ds"]},
}
# the kubelet's NetworkReady condition without a CNI config (kubelet/kuberuntime, containerd's CRI)
NO_CNI = ("container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady "
          "message:Network plugin returns error: cni plugin not initialized")
_DUR = re.compile(r"(\d+(?:\.\d+)?)(h|m|s)")
_TRACE = "To see the stack trace of this error execute with --v=5 or higher\n"


def clusters(guests: Guests) -> dict[str, dict[str, Any]]:
    """The simulator's clusters by endpoint."""
    if not hasattr(guests, "k8s_clusters"):
        guests.k8s_clusters = {}  # type: ignore[attr-defined]
    return guests.k8s_clusters  # type: ignore[attr-defined]


def expire_tokens(guests: Guests) -> int:
    """Fault: every bootstrap token of every cluster expires now; how many did."""
    n = 0
    for c in clusters(guests).values():
        for tok in c["tokens"]:
            c["tokens"][tok] = min(c["tokens"][tok], time.time() - 1)
            n += 1
    return n


def _duration_s(text: str) -> float | None:
    parts = _DUR.findall(text)
    if not parts or "".join(a + b for a, b in parts) != text:
        return None
    return sum(float(a) * {"h": 3600, "m": 60, "s": 1}[b] for a, b in parts)


def minor_of(version: Any) -> int | None:
    """``v1.33.0`` / ``1.33`` → 33 (Kubernetes 1.x); None when unparsable."""
    m = re.fullmatch(r"v?1\.(\d+)(?:\.\d+)?(?:[-+].*)?", str(version or "").strip())
    return int(m[1]) if m else None


# kubeadm, kubelet and kubectl are the image's: a guest has them only when its disk holds their
# Debian packages (z9.sim.guest.PACKAGED), and their version is the package's
PACKAGED.update(kubeadm="kubeadm", kubelet="kubelet", kubectl="kubectl")


def release_of(g: Any, package: str) -> str | None:
    """The Kubernetes release (``1.33.5``) of an installed package: its Debian version without the
    revision (pkgs.k8s.io: ``1.33.5-1.1``)."""
    v = installed_version(g, package)
    return v.split("-", 1)[0] if v else None


def _semver(release: str | None) -> tuple[int, int, int] | None:
    m = re.fullmatch(r"v?(\d+)\.(\d+)\.(\d+)(?:[-+].*)?", str(release or "").strip())
    return (int(m[1]), int(m[2]), int(m[3])) if m else None


def skew_problems(kubeadm_release: str, kubelet_release: str | None, control_plane: str | None,
                  *, joining: bool = False) -> tuple[str | None, list[tuple[str, str]], list[tuple[str, str]]]:
    """What kubeadm ``kubeadm_release`` makes of a control plane of ``control_plane`` (init: the
    config's kubernetesVersion; join: the cluster's, as fetched from its kubeadm-config) with this
    node's kubelet: ``(fatal, preflight errors, preflight warnings)``.

    - ``NormalizeKubernetesVersion`` (cmd/kubeadm/app/util/config/common.go; init's config, and
      join's ``FetchInitConfigurationFromCluster``): a control plane older than
      ``MinimumControlPlaneVersion`` = kubeadm's minor − 1 (``getSkewedKubernetesVersion(-1)``,
      cmd/kubeadm/app/constants/constants.go) is fatal before any preflight: "this version of kubeadm
      only supports deploying clusters with the control plane version >= 1.<m-1>.0. Current version: …".
    - ``KubernetesVersionCheck`` (preflight/checks.go, init and a joining control plane): a control
      plane of a newer minor than kubeadm is a *warning* ("Kubernetes version is greater than kubeadm
      version. Please consider to upgrade kubeadm. …").
    - ``KubeletVersionCheck`` (preflight/checks.go, addCommonChecks: init with the config's version,
      join with none): a kubelet older than ``MinimumKubeletVersion`` = kubeadm's minor − 3 is an
      error ("Kubelet version %q is lower than kubeadm can support. Please upgrade kubelet"); with a
      control-plane version (init), a kubelet of a newer minor is an error ("the kubelet version is
      higher than the control plane version. This is not a supported version skew and may lead to a
      malfunctional cluster. …" — the Version Skew Policy's "kubelet must not be newer than
      kube-apiserver")."""
    adm, cp, kl = _semver(kubeadm_release), _semver(control_plane), _semver(kubelet_release)
    assert adm is not None
    errors: list[tuple[str, str]] = []
    warnings: list[tuple[str, str]] = []
    if cp is not None and cp < (adm[0], adm[1] - 1, 0):
        return (f"this version of kubeadm only supports deploying clusters with the control plane version >= "
                f"{adm[0]}.{adm[1] - 1}.0. Current version: v{cp[0]}.{cp[1]}.{cp[2]}"), [], []
    if cp is not None and cp >= (adm[0], adm[1] + 1, 0):
        text = (f"Kubernetes version is greater than kubeadm version. Please consider to upgrade kubeadm. Kubernetes "
                f"version: {cp[0]}.{cp[1]}.{cp[2]}. Kubeadm version: {adm[0]}.{adm[1]}.x")
        warnings.append(("KubernetesVersion", text))
    if kl is None:
        text = "couldn't get kubelet version: exec: \"kubelet\": executable file not found in $PATH"
        errors.append(("KubeletVersion", text))
    elif kl < (adm[0], adm[1] - 3, 0):
        text = f"Kubelet version \"{kl[0]}.{kl[1]}.{kl[2]}\" is lower than kubeadm can support. Please upgrade kubelet"
        errors.append(("KubeletVersion", text))
    elif cp is not None and not joining and (kl[0] > cp[0] or kl[1] > cp[1]):
        text = ("the kubelet version is higher than the control plane version. This is not a supported version skew "
                f"and may lead to a malfunctional cluster. Kubelet version: \"{kl[0]}.{kl[1]}.{kl[2]}\" Control plane "
                f"version: \"{cp[0]}.{cp[1]}.{cp[2]}\"")
        errors.append(("KubeletVersion", text))
    return None, errors, warnings


def _ca_hash(pem: bytes) -> str:
    cert = x509.load_pem_x509_certificate(pem)
    spki = cert.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return "sha256:" + hashlib.sha256(spki).hexdigest()


def _load_config(ctx: ExecContext) -> tuple[dict[str, dict], ExecResult | None]:
    argv = ctx.argv
    path = next((a.split("=", 1)[1] for a in argv if a.startswith("--config=")), None)
    if path is None:
        if "--config" not in argv or argv.index("--config") + 1 >= len(argv):
            return {}, ExecResult(1, err="error: this model of kubeadm needs --config <file>\n")
        path = argv[argv.index("--config") + 1]
    raw = ctx.guest.read_file(path)
    if raw is None:
        return {}, ExecResult(1, err=f"unable to read config from \"{path}\" : open {path}: no such file or directory\n")
    try:
        docs = {d.get("kind"): d for d in yaml.safe_load_all(raw) if isinstance(d, dict)}
    except yaml.YAMLError as e:
        return {}, ExecResult(1, err=f"error converting YAML to JSON: {e}\n")
    return docs, None


# cmd/kubeadm/app/util/config/common.go validateSupportedVersion (1.28-1.30: v1beta4 in
# experimentalAPIVersions; 1.31+: "v1.31: v1beta3 read-only, writes only v1beta4 config",
# v1beta3 in deprecatedAPIVersions — a warning; 1.36: v1beta3 removed, kubernetes#136016);
# oldKnownAPIVersions: v1alpha1 … v1beta2 refused.
_OLD_APIS = {"kubeadm.k8s.io/v1alpha1": "v1.11", "kubeadm.k8s.io/v1alpha2": "v1.12", "kubeadm.k8s.io/v1alpha3": "v1.14",
             "kubeadm.k8s.io/v1beta1": "v1.15", "kubeadm.k8s.io/v1beta2": "v1.22"}


def api_version_problem(api_version: Any, kind: str, minor: int | None) -> tuple[str | None, str | None]:
    """``(error, warning)`` of kubeadm ``1.<minor>`` reading a ``kind`` document of ``api_version``
    (``minor`` None: the node's kubeadm version is not known — only version-independent rules)."""
    gv = str(api_version or "")
    if not gv:
        return (f"error decoding config: Object 'apiVersion' is missing in '{{\"kind\":\"{kind}\"}}'", None)
    if gv in _OLD_APIS:
        return (f"your configuration file uses an old API spec: \"{gv}\" (kind: \"{kind}\"). Please use kubeadm "
                f"{_OLD_APIS[gv]} instead and run 'kubeadm config migrate --old-config old-config-file --new-config "
                "new-config-file', which will write the new, similar spec using a newer API version.", None)
    if gv not in ("kubeadm.k8s.io/v1beta3", "kubeadm.k8s.io/v1beta4"):
        return (f"no kind \"{kind}\" is registered for version \"{gv}\" in scheme "
                "\"k8s.io/kubernetes/cmd/kubeadm/app/apis/kubeadm/scheme/scheme.go:31\"", None)
    if minor is None:
        return None, None
    if gv == "kubeadm.k8s.io/v1beta3" and minor >= 36:  # kubernetes/kubernetes#136016 (1.36)
        return (f"your configuration file uses an old API spec: \"{gv}\" (kind: \"{kind}\"). Please use kubeadm "
                "v1.35 instead and run 'kubeadm config migrate --old-config old-config-file --new-config "
                "new-config-file', which will write the new, similar spec using a newer API version.", None)
    if gv == "kubeadm.k8s.io/v1beta4" and minor < 31:
        if minor < 28:
            return (f"no kind \"{kind}\" is registered for version \"{gv}\" in scheme "
                    "\"k8s.io/kubernetes/cmd/kubeadm/app/apis/kubeadm/scheme/scheme.go:31\"", None)
        return (f"experimental API spec: \"{gv}\" is not allowed. You can use the --allow-experimental-api flag if "
                "the command supports it.", None)
    if gv == "kubeadm.k8s.io/v1beta3" and minor >= 31:
        return None, (f"W0000 00:00:00.000000       1 common.go:101] your configuration file uses a deprecated API "
                      f"spec: \"{gv}\" (kind: \"{kind}\"). Please use 'kubeadm config migrate --old-config "
                      "old-config-file --new-config new-config-file', which will write the new, similar spec using a "
                      "newer API version.")
    return None, None


def _check_api_versions(docs: dict[str, dict], minor: int | None) -> tuple[ExecResult | None, str]:
    warnings = ""
    for kind, doc in docs.items():
        if kind not in ("InitConfiguration", "ClusterConfiguration", "JoinConfiguration"):
            continue
        err, warn = api_version_problem(doc.get("apiVersion"), str(kind), minor)
        if err:
            return ExecResult(1, err=err + "\n" + _TRACE), warnings
        if warn:
            warnings += warn + "\n"
    return None, warnings


def _ignored(argv: list[str]) -> set[str]:
    """``--ignore-preflight-errors=a,b`` (or the value as the next argument), lower-cased as RunChecks does."""
    out: set[str] = set()
    for i, a in enumerate(argv):
        val = a.split("=", 1)[1] if a.startswith("--ignore-preflight-errors=") else (
            argv[i + 1] if a == "--ignore-preflight-errors" and i + 1 < len(argv) else None)
        if val:
            out |= {v.strip().lower() for v in val.split(",") if v.strip()}
    return out


def _preflight(checks: list[tuple[str, str]], argv: list[str], prefix: str = "",
               warn_only: frozenset[str] | set[str] = frozenset()) -> ExecResult | None:
    """checks.go ``RunChecks``/``handleError``: every failed check, then exit 1 (ignored ones and
    the checks that return warnings, ``warn_only``: warnings)."""
    ignored = _ignored(argv)
    errs = [(n, m) for n, m in checks
            if n not in warn_only and "all" not in ignored and n.lower() not in ignored]
    warns = [(n, m) for n, m in checks if (n, m) not in errs]
    warn_text = "".join(f"\t[WARNING {n}]: {m}\n" for n, m in warns)
    if not errs:
        return ExecResult(0, err=warn_text) if warn_text else None
    return ExecResult(1, out=prefix + "[preflight] Running pre-flight checks\n",
                      err=warn_text + "error execution phase preflight: [preflight] Some fatal errors occurred:\n"
                      + "".join(f"\t[ERROR {n}]: {m}\n" for n, m in errs)
                      + "[preflight] If you know what you are doing, you can make a check non-fatal with "
                        "`--ignore-preflight-errors=...`\n" + _TRACE)


def _file_available(ctx: ExecContext, path: str) -> list[tuple[str, str]]:
    """checks.go ``FileAvailableCheck``: the file must not exist."""
    if ctx.guest.read_file(path) is None:
        return []
    return [("FileAvailable-" + path.replace("/", "-"), f"{path} already exists")]


def _dir_available(ctx: ExecContext, path: str) -> list[tuple[str, str]]:
    """checks.go ``DirAvailableCheck``: the directory must not exist or be empty."""
    if not any(p.startswith(path.rstrip("/") + "/") for p in ctx.guest.files()):
        return []
    return [("DirAvailable-" + path.replace("/", "-"), f"{path} is not empty")]


def _ports_in_use(ctx: ExecContext, ports: tuple[int, ...]) -> list[tuple[str, str]]:
    """checks.go ``PortOpenCheck``: what kubeadm started on this disk listens again while the guest
    runs (the kubelet is a systemd unit; the control plane's static pods come back with it)."""
    role = ctx.guest.model("kubeadm").get("role")
    busy = set(NODE_PORTS) | (set(CONTROL_PLANE_PORTS) if role == "control-plane" else set()) if role else set()
    return [(f"Port-{p}", f"Port {p} is in use") for p in ports if p in busy]


def _control_plane_checks(ctx: ExecContext, *, kubelet: bool) -> list[tuple[str, str]]:
    """checks.go ``InitNodeChecks``: the control plane's ports free, its static pod manifests
    absent, (local etcd) etcd's ports free and its data dir empty; ``kubelet``: with
    addCommonChecks' Port-10250 (init; a joining control plane had it in JoinNodeChecks). First in
    that list: ``NumCPUCheck{NumCPU: ControlPlaneNumCPU}`` (``runtime.NumCPU()``) and (Linux)
    ``MemCheck{Mem: ControlPlaneMem}`` (checks_linux.go: sysinfo's Totalram), with their texts."""
    out: list[tuple[str, str]] = []
    cpus, ram = guest_cpus(ctx.config), guest_ram_mb(ctx.config)
    if cpus < CONTROL_PLANE_NUM_CPU:
        out.append(("NumCPU", f"the number of available CPUs {cpus} is less than the required {CONTROL_PLANE_NUM_CPU}"))
    if ram < CONTROL_PLANE_MEM_MB:
        out.append(("Mem", f"the system RAM ({ram} MB) is less than the minimum {CONTROL_PLANE_MEM_MB} MB"))
    out += _ports_in_use(ctx, (6443, 10259, 10257))
    for pod in CONTROL_PLANE_PODS[:3]:
        out += _file_available(ctx, f"{MANIFESTS}{pod}.yaml")
    out += _file_available(ctx, f"{MANIFESTS}etcd.yaml")
    if kubelet:
        out += _ports_in_use(ctx, (10250,))
    out += _ports_in_use(ctx, (2379, 2380))
    out += _dir_available(ctx, ETCD_DATA)
    return out


@functools.lru_cache(maxsize=512)
def _kube_vip_spec(raw: bytes, host: str) -> tuple[str | None, str | None]:
    """``(problem, hostPath of its kubeconfig)`` of a kube-vip static pod manifest (kube-vip docs,
    "Static Pods": ``kube-vip manifest pod --controlplane --arp --address VIP`` writes hostNetwork,
    capabilities NET_ADMIN + NET_RAW, and a hostPath kubeconfig mounted at /etc/kubernetes/admin.conf,
    kube-vip's default --k8sConfigPath)."""
    try:
        pod = yaml.safe_load(raw)
    except yaml.YAMLError as e:
        return f"{KUBE_VIP} is not valid YAML: {e}", None
    if not isinstance(pod, dict) or pod.get("kind") != "Pod":
        return f"{KUBE_VIP} is not a Pod", None
    spec = pod.get("spec") or {}
    if spec.get("hostNetwork") is not True:
        return "hostNetwork is not true (the VIP would be added inside the pod's own network namespace)", None
    containers = spec.get("containers") or []
    c = next((x for x in containers if "kube-vip" in str(x.get("image", ""))), containers[0] if containers else None)
    if not isinstance(c, dict):
        return "no container", None
    env = {str(e.get("name")): str(e.get("value")) for e in c.get("env") or [] if isinstance(e, dict)}
    addr = env.get("address") or env.get("vip_address")
    if addr != host:
        return f"its address {addr!r} is not the control-plane endpoint {host}", None
    if env.get("cp_enable", "").lower() != "true":
        return "cp_enable is not true (kube-vip does not manage the control-plane VIP)", None
    caps = set(((c.get("securityContext") or {}).get("capabilities") or {}).get("add") or [])
    missing = sorted({"NET_ADMIN", "NET_RAW"} - caps)
    if missing:
        return (f"securityContext.capabilities.add lacks {', '.join(missing)} (kube-vip cannot add the VIP to the "
                "interface or send gratuitous ARP)"), None
    mount = next((m for m in c.get("volumeMounts") or [] if m.get("mountPath") == ADMIN_CONF), None)
    if mount is None:
        return (f"no kubeconfig mounted at {ADMIN_CONF} (kube-vip cannot reach the API server for its leader "
                "election, so it never takes the VIP)"), None
    vol = next((v for v in spec.get("volumes") or [] if v.get("name") == mount.get("name")), None)
    path = ((vol or {}).get("hostPath") or {}).get("path")
    if not path:
        return f"the volume {mount.get('name')!r} mounted at {ADMIN_CONF} is not a hostPath", None
    return None, str(path)


def _filtered(guest: Any, ip: str) -> bool:
    """The guest's VM's Proxmox IP filter drops what it sends from ``ip`` (pve-firewall ``ipfilter``:
    :meth:`z9.sim.firewall.Firewall.refuses_source`)."""
    cluster = guest.guests.cluster
    if cluster is None:  # guests without a cluster (the model driven alone, in unit tests): no firewall
        return False
    vm = cluster.vms.get(guest.vmid)
    return vm is not None and cluster.firewall.refuses_source(guest.vmid, vm.config, ip)


def source_filtered(guest: Any) -> str | None:
    """The guest's own address (the first its network config gave it) when its VM's IP filter drops
    what it sends from there: nothing it sends reaches the bridge (None: it is heard)."""
    for n in guest.net_applied:
        for cidr in n.get("addresses") or []:
            ip = cidr.split("/", 1)[0]
            return ip if _filtered(guest, ip) else None
    return None


def kube_vip_problem(guest: Any, host: str, *, initializing: bool = False, minor: int | None = None) -> str | None:
    """Why the kube-vip static pod on ``guest`` does not hold ``host`` (None: it does). A VM whose
    IP filter drops the VIP as a source never answers from it (its gratuitous ARP and replies are
    dropped at the tap: pve-firewall ``ipfilter``), so kube-vip there holds nothing anyone reaches."""
    if _filtered(guest, host):
        return (f"its VM's IP filter (ipfilter-net0) does not hold {host}: what it sends from the VIP is dropped "
                "at its tap")
    raw = guest.read_file(KUBE_VIP)
    if raw is None:
        return f"no static pod manifest {KUBE_VIP}"
    problem, path = _kube_vip_spec(bytes(raw), host)
    if problem:
        return problem
    if guest.read_file(path) is None:  # a missing hostPath becomes an empty directory (hostPath type "")
        return f"its kubeconfig hostPath {path} does not exist on this node"
    # kubeadm 1.29+ (kubernetes/kubernetes#121305): admin.conf's user is in kubeadm:cluster-admins,
    # bound to cluster-admin by init only after the API answers at the endpoint (kube-vip#684)
    if initializing and minor is not None and minor >= 29 and path != SUPER_ADMIN_CONF:
        return (f"its kubeconfig is {path}; on the node running kubeadm init of 1.29+ it must be {SUPER_ADMIN_CONF} "
                "(admin.conf's user gets cluster-admin only at the end of init: kube-vip's leader election is "
                "forbidden until then)")
    return None


def _api_up(guests: Guests, c: dict[str, Any]) -> bool:
    """The API answers at the endpoint: past its start delay, and a running control plane's
    kube-vip holds the VIP."""
    if time.time() < c["api_up_at"]:
        return False
    host = c["endpoint"].rsplit(":", 1)[0]
    for vmid in c["control_planes"]:
        g = guests.guests.get(int(vmid))
        if g is not None and g.powered and g.booted and kube_vip_problem(g, host) is None:
            return True
    return False


def _firewall_drops(guest: Any, dst_vmid: int, dst_ip: str, port: int) -> Any:
    """The PVE firewall's verdict on a TCP connection ``guest`` opens from its own address to
    ``dst_ip:port`` held by ``dst_vmid`` (:func:`z9.sim.firewall.dropped`): the Delivery when it is
    dropped or rejected, None when it passes (or the firewall has no say)."""
    from .firewall import dropped

    cluster = guest.guests.cluster
    src = next((a.split("/", 1)[0] for n in guest.net_applied for a in n.get("addresses") or []), None)
    if cluster is None or src is None:
        return None
    return dropped(cluster, guest.vmid, src, int(dst_vmid), dst_ip, "tcp", port)


def _own_ip(guests: Guests, vmid: int) -> str | None:
    g = guests.guests.get(int(vmid))
    return next((a.split("/", 1)[0] for n in (g.net_applied if g else []) for a in n.get("addresses") or []), None)


def _guest_up(guests: Guests, vmid: int) -> bool:
    g = guests.guests.get(int(vmid))
    return bool(g is not None and g.powered and g.booted)


def _missing_pki(ctx: ExecContext) -> str | None:
    for f in PKI_FILES:
        if ctx.guest.read_file(PKI + f) is None:
            return f
    return None


def _refused(endpoint: str) -> str:
    return (f"error execution phase preflight: couldn't validate the identity of the API Server: Get "
            f"\"https://{endpoint}/api/v1/namespaces/kube-public/configmaps/cluster-info?timeout=10s\": dial tcp "
            f"{endpoint}: connect: connection refused\n")


def _kubeconfig(endpoint: str, user: str) -> str:
    return yaml.safe_dump({"apiVersion": "v1", "kind": "Config", "current-context": f"{user}@kubernetes",
                           "clusters": [{"name": "kubernetes", "cluster": {"server": f"https://{endpoint}"}}],
                           "users": [{"name": user}]})


def _write_control_plane(ctx: ExecContext, endpoint: str) -> None:
    """What init/join write on a control plane: its static pods, etcd's data, the kubelet's and
    the admin's kubeconfigs."""
    g = ctx.guest
    for pod in CONTROL_PLANE_PODS:
        g.write_file(f"{MANIFESTS}{pod}.yaml", yaml.safe_dump({"apiVersion": "v1", "kind": "Pod",
                                                               "metadata": {"name": pod, "namespace": "kube-system"}}))
    g.write_file(f"{ETCD_DATA}/member/snap/db", b"\0")
    g.write_file(ADMIN_CONF, _kubeconfig(endpoint, "kubernetes-admin"))


def _init(ctx: ExecContext) -> ExecResult:
    docs, err = _load_config(ctx)
    if err:
        return err
    cc, ic = docs.get("ClusterConfiguration") or {}, docs.get("InitConfiguration") or {}
    minor = minor_of(cc.get("kubernetesVersion"))
    adm = release_of(ctx.guest, "kubeadm") or ""
    # the config is read by this node's kubeadm: its minor decides which config APIs it knows
    bad, warnings = _check_api_versions(docs, minor_of(adm))
    if bad:
        return bad
    endpoint = str(cc.get("controlPlaneEndpoint") or "")
    name = str((ic.get("nodeRegistration") or {}).get("name") or ctx.guest.hostname)
    if not endpoint:
        return ExecResult(1, err="this model needs ClusterConfiguration.controlPlaneEndpoint\n")
    if minor is None:
        return ExecResult(1, err=f"this model needs ClusterConfiguration.kubernetesVersion (v1.<minor>.<patch>), "
                                 f"not {cc.get('kubernetesVersion')!r}\n")
    kubelet = release_of(ctx.guest, "kubelet")
    fatal, skew, skew_warn = skew_problems(adm, kubelet, str(cc.get("kubernetesVersion")))
    if fatal:
        return ExecResult(1, err=warnings + fatal + "\n" + _TRACE)
    # phases/init/preflight.go: RunInitNodeChecks (checks.go InitNodeChecks + addCommonChecks)
    failed = _preflight(skew_warn + _control_plane_checks(ctx, kubelet=True) + skew, ctx.argv,
                        f"[init] Using Kubernetes version: {cc.get('kubernetesVersion')}\n",
                        warn_only={n for n, _ in skew_warn})
    if failed is not None and failed.exitcode:
        failed.err = warnings + _text(failed.err)
        return failed
    warnings += _text(failed.err) if failed is not None else ""
    missing = _missing_pki(ctx)
    if missing:
        return ExecResult(1, err=f"error execution phase certs/ca: failure loading {missing}: couldn't load the file "
                                 f"{PKI}{missing}: open {PKI}{missing}: no such file or directory\n")
    ca_crt, ca_key = ctx.guest.read_file(PKI + "ca.crt"), ctx.guest.read_file(PKI + "ca.key")
    try:
        cert = x509.load_pem_x509_certificate(ca_crt or b"")
        key = serialization.load_pem_private_key(ca_key or b"", None)
        pub = lambda k: k.public_bytes(serialization.Encoding.DER,  # noqa: E731
                                       serialization.PublicFormat.SubjectPublicKeyInfo)
        if pub(cert.public_key()) != pub(key.public_key()):
            raise ValueError("private key does not match public key")
    except ValueError as e:
        return ExecResult(1, err=f"error execution phase certs/ca: failure loading ca certificate authority: {e}\n")
    # phases kubeconfig, kubelet-start, control-plane, etcd: on disk and running from here on
    _write_control_plane(ctx, endpoint)
    if minor >= 29:  # phases/init/kubeconfig.go: super-admin.conf (1.29+), only on this node
        ctx.guest.write_file(SUPER_ADMIN_CONF, _kubeconfig(endpoint, "kubernetes-super-admin"))
    ctx.guest.write_file(KUBELET_CONF, _kubeconfig(endpoint, f"system:node:{name}"))
    m = ctx.guest.model("kubeadm")
    m.update(endpoint=endpoint, role="control-plane", node=name, api_version=str(ic.get("apiVersion") or ""))
    host = endpoint.rsplit(":", 1)[0]
    vip = kube_vip_problem(ctx.guest, host, initializing=True, minor=minor)
    if vip:  # wait-control-plane / upload-config reach the API through the endpoint: nothing answers there
        return ExecResult(1, err=warnings + "[api-check] Waiting for a healthy API server. This can take up to 4m0s\n"
                                 "[api-check] The API server is not healthy after 4m0s\n"
                                 "error execution phase wait-control-plane: could not initialize a Kubernetes cluster\n"
                                 f"(kubeadm model: nothing holds the control-plane endpoint {endpoint}: kube-vip: "
                                 f"{vip})\n" + _TRACE)
    now = time.time()
    net = cc.get("networking") or {}
    # kubeadm's default --client-ca-file is the cluster CA; ClusterConfiguration.apiServer.extraArgs
    # may name another (kubeadm docs, "Customizing components"): v1beta4 a list of {name, value},
    # v1beta3 a map
    args = _extra_args(cc.get("apiServer"))
    c = clusters(ctx.guest.guests)[endpoint] = {
        "client_ca_file": args.get("client-ca-file", PKI + "ca.crt"),
        **controller_manager_signers(_extra_args(cc.get("controllerManager"))),
        "endpoint": endpoint, "version": str(cc.get("kubernetesVersion") or ""), "minor": minor,
        "pod_subnet": str(net.get("podSubnet") or ""), "cni": None, "init_vmid": ctx.guest.vmid,
        "ca_crt": (ca_crt or b"").decode(), "ca_hash": _ca_hash(ca_crt or b""),
        "api_up_at": now + SETTINGS["api_delay_s"], "tokens": {}, "control_planes": [ctx.guest.vmid],
        "nodes": {name: {"vmid": ctx.guest.vmid, "role": "control-plane", "unschedulable": False, "joined_at": now,
                         "kubelet": kubelet}},
        "events": [["init", name, now]],
    }
    for bt in ic.get("bootstrapTokens") or []:
        ttl = _duration_s(str(bt.get("ttl", "24h0m0s"))) or 86400.0
        c["tokens"][str(bt.get("token"))] = now + ttl
    m.update(cluster=endpoint)
    return ExecResult(0, out="Your Kubernetes control-plane has initialized successfully!\n", err=warnings)


def _extra_args(component: Any) -> dict[str, str]:
    """A component's ``extraArgs`` (kubeadm API reference: v1beta4 a list of {name, value}, v1beta3
    a map) as a map."""
    extra = (component or {}).get("extraArgs") or [] if isinstance(component, dict) else []
    if isinstance(extra, dict):
        return {str(k): str(v) for k, v in extra.items()}
    return {str(a.get("name")): str(a.get("value")) for a in extra if isinstance(a, dict)}


#: kube-controller-manager's CSR signers and the flag naming each one's files
CSR_SIGNERS = {"kubernetes.io/kube-apiserver-client": "kube-apiserver-client",
               "kubernetes.io/kube-apiserver-client-kubelet": "kubelet-client",
               "kubernetes.io/kubelet-serving": "kubelet-serving", "kubernetes.io/legacy-unknown": "legacy-unknown"}


def controller_manager_signers(extra: dict[str, str]) -> dict[str, Any]:
    """What kube-controller-manager's csrsigning controller signs with, from kubeadm's defaults
    (``getControllerManagerCommand``: ``--cluster-signing-{cert,key}-file`` = the cluster CA; the
    flag's own default ``--cluster-signing-duration`` 8760h) overridden by
    ``controllerManager.extraArgs``: ``csr_signers`` {signer name: [cert file, key file]} (a signer
    without files does not run) and ``csr_signing_duration_s``; or ``controller_manager_error``
    when kube-controller-manager refuses its flags (it exits: no signer runs). The rules are
    kube-controller-manager's: cmd/kube-controller-manager/app/options/csrsigningcontroller.go
    ``Validate`` (a cert without its key; the single pair beside any per-signer file) and
    cmd/kube-controller-manager/app/certificates.go (``get<Signer>SignerFiles``: once any per-signer
    file is set, the single pair is used by none)."""
    args = {"cluster-signing-cert-file": PKI + "ca.crt", "cluster-signing-key-file": PKI + "ca.key", **extra}
    single = (args.get("cluster-signing-cert-file", ""), args.get("cluster-signing-key-file", ""))
    pairs = {name: (args.get(f"cluster-signing-{flag}-cert-file", ""), args.get(f"cluster-signing-{flag}-key-file", ""))
             for name, flag in CSR_SIGNERS.items()}
    errors = [f"\"cluster-signing-{CSR_SIGNERS[n]}\": cannot specify {'key without cert' if k else 'cert without key'}"
              for n, (crt, k) in pairs.items() if bool(crt) != bool(k)]
    if any(single) and any(crt or k for crt, k in pairs.values()):
        errors.append("cannot specify --cluster-signing-{cert,key}-file and other --cluster-signing-*-file flags at "
                      "the same time")
    specific = any(crt or k for crt, k in pairs.values())
    signers = {n: list(pairs[n] if specific else single) for n in CSR_SIGNERS}
    duration = _duration_s(args.get("cluster-signing-duration", "8760h0m0s"))
    if duration is None:
        errors.append(f"invalid argument for --cluster-signing-duration: {args.get('cluster-signing-duration')!r}")
    return {"csr_signers": {n: v for n, v in signers.items() if all(v)}, "csr_signing_duration_s": duration,
            "controller_manager_error": "; ".join(errors) or None}


def _text(b: str | bytes) -> str:
    return b.decode("utf-8", "replace") if isinstance(b, bytes) else b


def _join(ctx: ExecContext) -> ExecResult:
    docs, err = _load_config(ctx)
    if err:
        return err
    jc = docs.get("JoinConfiguration") or {}
    bt = (jc.get("discovery") or {}).get("bootstrapToken") or {}
    endpoint, token = str(bt.get("apiServerEndpoint") or ""), str(bt.get("token") or "")
    guests = ctx.guest.guests
    c = clusters(guests).get(endpoint)
    adm = release_of(ctx.guest, "kubeadm") or ""
    kubelet = release_of(ctx.guest, "kubelet")
    # the config is read by this node's kubeadm (the image's)
    bad, warnings = _check_api_versions(docs, minor_of(adm))
    if bad:
        return bad
    hashes = [str(h) for h in bt.get("caCertHashes") or []]
    name = str((jc.get("nodeRegistration") or {}).get("name") or ctx.guest.hostname)
    control_plane = jc.get("controlPlane") is not None
    # phases/join/preflight.go: RunJoinNodeChecks first (checks.go JoinNodeChecks) ...
    checks = _file_available(ctx, KUBELET_CONF) + _file_available(ctx, BOOTSTRAP_KUBELET_CONF)
    checks += _ports_in_use(ctx, (10250,))
    checks += skew_problems(adm, kubelet, None, joining=True)[1]  # addCommonChecks: KubeletVersionCheck{""}
    if not control_plane:  # JoinNodeChecks: cfg.ControlPlane == nil → FileAvailableCheck{cfg.CACertPath}
        checks += _file_available(ctx, str(jc.get("caCertPath") or PKI + "ca.crt"))
    failed = _preflight(checks, ctx.argv)
    if failed is not None and failed.exitcode:
        failed.err = warnings + _text(failed.err)
        return failed
    warnings += _text(failed.err) if failed is not None else ""
    # ... then discovery (j.InitCfg() → discovery/token: cluster-info, its JWS signature, the CA pin) ...
    if source_filtered(ctx.guest):  # its own packets dropped at the tap: the dial never connects
        return ExecResult(1, err=warnings + "error execution phase preflight: couldn't validate the identity of the "
                                 f"API Server: Get \"https://{endpoint}/api/v1/namespaces/kube-public/configmaps/"
                                 f"cluster-info?timeout=10s\": dial tcp {endpoint}: i/o timeout\n")
    if c is not None and _api_up(guests, c):
        # the discovery's dial to the endpoint (the control plane whose kube-vip holds it) crosses the
        # PVE firewall: a dropped SYN times out (the same "i/o timeout" as above), a rejected one is
        # reset ("connection refused": PVEFW-reject answers TCP with a reset)
        host, _, port = endpoint.rpartition(":")
        holder = next(v for v in c["control_planes"] if _guest_up(guests, v)
                      and kube_vip_problem(guests.guests[int(v)], host) is None)
        blocked = _firewall_drops(ctx.guest, holder, host, int(port or 6443))
        if blocked is not None and blocked.rejected:
            return ExecResult(1, err=warnings + _refused(endpoint))
        if blocked is not None:
            return ExecResult(1, err=warnings + "error execution phase preflight: couldn't validate the identity of "
                                     f"the API Server: Get \"https://{endpoint}/api/v1/namespaces/kube-public/"
                                     f"configmaps/cluster-info?timeout=10s\": dial tcp {endpoint}: i/o timeout\n")
    if c is None or not _api_up(guests, c):
        return ExecResult(1, err=warnings + _refused(endpoint))
    tid = token.split(".", 1)[0]
    if token not in c["tokens"] or c["tokens"][token] < time.time():
        return ExecResult(1, err=warnings + "error execution phase preflight: couldn't validate the identity of the "
                                 "API Server: could not find a JWS signature in the cluster-info ConfigMap for token "
                                 f"ID \"{tid}\"\n" + _TRACE)
    if c["ca_hash"] not in hashes:
        return ExecResult(1, err=warnings + "error execution phase preflight: couldn't validate the identity of the "
                                 "API Server: cluster CA found in cluster-info ConfigMap is invalid: none of the public "
                                 f"keys \"{c['ca_hash']}\" are pinned\n" + _TRACE)
    # ... the cluster's ClusterConfiguration fetched (FetchInitConfigurationFromCluster →
    # SetClusterDynamicDefaults → NormalizeKubernetesVersion): this kubeadm against the cluster's version
    fatal, _, skew_warn = skew_problems(adm, kubelet, c.get("version"), joining=True)
    if fatal:
        return ExecResult(1, err=warnings + "[preflight] Reading configuration from the cluster...\n"
                                 f"error execution phase preflight: unable to fetch the kubeadm-config ConfigMap: "
                                 f"{fatal}\n" + _TRACE)
    if control_plane:  # ... then, for a control plane, RunInitNodeChecks(isSecondaryControlPlane=true)
        failed = _preflight(skew_warn + _control_plane_checks(ctx, kubelet=False), ctx.argv,
                            warn_only={n for n, _ in skew_warn})
        if failed is not None and failed.exitcode:
            failed.err = warnings + _text(failed.err)
            return failed
        missing = _missing_pki(ctx)
        if missing:
            return ExecResult(1, err=f"error execution phase control-plane-prepare/certs: {PKI}{missing}: "
                                     "no such file or directory\n")
    if control_plane:
        # phases/join/controlplanejoin.go runEtcdPhase → etcd/local.go CreateStackedEtcdStaticPodManifestFile:
        # the new member is added through the existing members' client port (2379), then the new etcd
        # must sync with them over the peer port (2380, both ways); etcdutil WaitForClusterAvailable gives
        # up with "timeout waiting for etcd cluster to be available" (the PVE firewall dropping either)
        for v in c["control_planes"]:
            peer_ip, own_ip = _own_ip(guests, v), _own_ip(guests, ctx.guest.vmid)
            if int(v) == ctx.guest.vmid or not _guest_up(guests, v) or peer_ip is None or own_ip is None:
                continue
            if (_firewall_drops(ctx.guest, v, peer_ip, 2379) or _firewall_drops(ctx.guest, v, peer_ip, 2380)
                    or _firewall_drops(guests.guests[int(v)], ctx.guest.vmid, own_ip, 2380)):
                return ExecResult(1, err=warnings + "error execution phase control-plane-join/etcd: error creating "
                                         "local etcd static pod manifest file: timeout waiting for etcd cluster "
                                         "to be available\n" + _TRACE)
    if name in c["nodes"] and c["nodes"][name]["vmid"] != ctx.guest.vmid and _guest_up(guests, c["nodes"][name]["vmid"]):
        return ExecResult(1, err=f"error execution phase kubelet-start: a Node with name \"{name}\" and status "
                                 "\"Ready\" already exists in the cluster\n")
    if c.get("controller_manager_error") or "kubernetes.io/kube-apiserver-client-kubelet" not in c.get(
            "csr_signers", {"kubernetes.io/kube-apiserver-client-kubelet": None}):
        # the kubelet's TLS bootstrap: its CSR (signer kube-apiserver-client-kubelet) is approved
        # but nothing signs it, and kubeadm's kubelet-start phase waits in vain
        return ExecResult(1, err=warnings + "[kubelet-start] Waiting for the kubelet to perform the TLS Bootstrap\n"
                                 "error execution phase kubelet-start: timed out waiting for the condition\n" + _TRACE)
    now = time.time()
    c["nodes"][name] = {"vmid": ctx.guest.vmid, "role": "control-plane" if control_plane else "worker",
                        "unschedulable": False, "joined_at": now, "token": tid, "kubelet": kubelet}
    c["events"].append(["join", name, now])
    ctx.guest.write_file(KUBELET_CONF, _kubeconfig(endpoint, f"system:node:{name}"))
    ctx.guest.write_file(PKI + "ca.crt", c["ca_crt"])  # kubelet-start writes the discovered CA (worker)
    if control_plane:
        if ctx.guest.vmid not in c["control_planes"]:
            c["control_planes"].append(ctx.guest.vmid)
        _write_control_plane(ctx, endpoint)
    m = ctx.guest.model("kubeadm")
    m.update(endpoint=endpoint, role="control-plane" if control_plane else "worker", node=name, token=tid,
             cluster=endpoint, api_version=str(jc.get("apiVersion") or ""))
    return ExecResult(0, out="This node has joined the cluster\n", err=warnings)


def _my_cluster(ctx: ExecContext) -> dict[str, Any] | None:
    ep = ctx.guest.model("kubeadm").get("endpoint")
    if ctx.guest.read_file(ADMIN_CONF) is None or not ep:
        return None
    return clusters(ctx.guest.guests).get(ep)


def _token_create(ctx: ExecContext) -> ExecResult:
    args = ctx.argv[3:]
    c = _my_cluster(ctx)
    if c is None:
        return ExecResult(1, err="failed to load admin kubeconfig: open /etc/kubernetes/admin.conf: no such file or directory\n")
    if not _api_up(ctx.guest.guests, c):
        return ExecResult(1, err=f"timed out waiting for the condition: dial tcp {c['endpoint']}: connect: connection refused\n")
    token = next((a for a in args if not a.startswith("-") and re.fullmatch(r"[a-z0-9]{6}\.[a-z0-9]{16}", a)), None)
    ttl = 86400.0
    if "--ttl" in args and args.index("--ttl") + 1 < len(args):
        got = _duration_s(args[args.index("--ttl") + 1])
        if got is None:
            return ExecResult(1, err=f"invalid argument \"{args[args.index('--ttl') + 1]}\" for \"--ttl\" flag\n")
        ttl = got
    if token is None:
        return ExecResult(1, err="this model needs the token: kubeadm token create <token> --ttl <duration>\n")
    if token in c["tokens"]:
        tid = token.split(".")[0]
        return ExecResult(1, err=f"failed to create or update bootstrap token with name bootstrap-token-{tid}: "
                                 f"secrets \"bootstrap-token-{tid}\" already exists\n")
    c["tokens"][token] = time.time() + ttl
    return ExecResult(0, out=token + "\n")


@command("kubeadm")
def kubeadm(ctx: ExecContext) -> ExecResult:
    sub = ctx.argv[1:3]
    if sub[:1] == ["init"]:
        return _init(ctx)
    if sub[:1] == ["join"]:
        return _join(ctx)
    if sub == ["token", "create"]:
        return _token_create(ctx)
    if sub[:1] == ["version"]:  # cmd/kubeadm/app/cmd/version.go: -o short is the GitVersion alone
        v = _semver(release_of(ctx.guest, "kubeadm"))
        assert v is not None
        if ctx.argv[2:] in (["-o", "short"], ["--output=short"], ["-oshort"], ["--output", "short"]):
            return ExecResult(0, out=f"v{v[0]}.{v[1]}.{v[2]}\n")
        return ExecResult(0, out=f"kubeadm version: &version.Info{{Major:\"{v[0]}\", Minor:\"{v[1]}\", "
                                 f"GitVersion:\"v{v[0]}.{v[1]}.{v[2]}\", GoVersion:\"go1.24\", Compiler:\"gc\", "
                                 f"Platform:\"linux/amd64\"}}\n")
    return ExecResult(1, err=f"unknown command \"{' '.join(sub)}\" for \"kubeadm\"\n")


@command("kubelet")
def kubelet(ctx: ExecContext) -> ExecResult:
    """``kubelet --version`` (component-base's version flag: "Kubernetes v1.33.5"); the kubelet
    itself runs as a systemd unit, never by z9."""
    if ctx.argv[1:] == ["--version"]:
        v = _semver(release_of(ctx.guest, "kubelet"))
        assert v is not None
        return ExecResult(0, out=f"Kubernetes v{v[0]}.{v[1]}.{v[2]}\n")
    return ExecResult(1, err="this model runs only `kubelet --version` (the kubelet is a systemd unit)\n")


def network_problem(c: dict[str, Any], node: str) -> str | None:
    """Why the kubelet of ``node`` reports NetworkReady=false (None: the pod network is up)."""
    cni = c.get("cni")
    if cni is None:
        return NO_CNI
    known = {"network": cni.get("network") or CNI_MANIFESTS.get(cni.get("url") or "", {}).get("network")}
    try:
        ok = bool(c.get("pod_subnet")) and ipaddress.ip_network(c["pod_subnet"]).subnet_of(
            ipaddress.ip_network(known["network"]))  # type: ignore[arg-type]
    except (ValueError, TypeError):
        ok = False
    if not ok:  # flanneld: the node's spec.podCIDR is allocated only with networking.podSubnet set
        return (f"{NO_CNI} (kube-flannel: Error registering network: failed to acquire lease: node \"{node}\" pod cidr "
                f"not assigned — networking.podSubnet {c.get('pod_subnet') or '(unset)'} is not inside flannel's "
                f"{known['network']})")
    return None


def _kubelet_cut_off(guests: Guests, c: dict[str, Any], n: dict[str, Any]) -> bool:
    """A worker's kubelet posts its node status to the API server through the endpoint (its
    kubelet.conf); when the PVE firewall drops that connection the node-lifecycle controller marks
    the node Unknown once the grace period passes ("Kubelet stopped posting node status")."""
    if n["role"] != "worker":
        return False
    host, _, port = c["endpoint"].rpartition(":")
    holder = next((v for v in c["control_planes"] if _guest_up(guests, v)
                   and kube_vip_problem(guests.guests[int(v)], host) is None), None)
    g = guests.guests.get(int(n["vmid"]))
    return holder is not None and g is not None and _firewall_drops(g, holder, host, int(port or 6443)) is not None


def _node_json(guests: Guests, c: dict[str, Any], name: str, n: dict[str, Any]) -> dict[str, Any]:
    up = _guest_up(guests, n["vmid"]) and not _kubelet_cut_off(guests, c, n)
    net = network_problem(c, name)
    labels = {"kubernetes.io/hostname": name}
    if n["role"] == "control-plane":
        labels["node-role.kubernetes.io/control-plane"] = ""
    if not up:
        cond = {"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown",
                "message": "Kubelet stopped posting node status."}
    elif net:
        cond = {"type": "Ready", "status": "False", "reason": "KubeletNotReady", "message": net}
    else:
        cond = {"type": "Ready", "status": "True", "reason": "KubeletReady",
                "message": "kubelet is posting ready status"}
    # status.nodeInfo.kubeletVersion: what the node's kubelet reports of itself (core/v1 NodeSystemInfo)
    info = {"kubeletVersion": f"v{n['kubelet']}"} if n.get("kubelet") else {}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels},
            "spec": {"unschedulable": True} if n["unschedulable"] else {},
            "status": {"conditions": [cond], "nodeInfo": info}}


# kubectl's resource names in apply's output: <kind>[.<group>]/<name> (core kinds have no group)
def _object_name(doc: dict[str, Any]) -> str:
    group = str(doc.get("apiVersion") or "").rpartition("/")[0]
    return f"{str(doc.get('kind', '')).lower()}{'.' + group if group else ''}/{(doc.get('metadata') or {}).get('name')}"


def flannel_in(docs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """What a manifest of Flannel installs (None: it is not Flannel's): its release (the flanneld
    image's tag in the DaemonSet), its network (``net-conf.json``'s ``Network`` in the
    ``kube-flannel-cfg`` ConfigMap, None when unreadable: flanneld would not start) and its objects."""
    version = None
    for d in docs:
        if d.get("kind") == "DaemonSet":
            for ctr in (((d.get("spec") or {}).get("template") or {}).get("spec") or {}).get("containers") or []:
                img = str(ctr.get("image") or "")
                if img.rpartition(":")[0].endswith("flannel/flannel"):
                    version = img.rpartition(":")[2]
    if version is None:
        return None
    network = None
    for d in docs:
        if d.get("kind") == "ConfigMap" and (d.get("metadata") or {}).get("name") == "kube-flannel-cfg":
            try:
                network = json.loads(((d.get("data") or {}).get("net-conf.json")) or "{}").get("Network")
            except ValueError:
                network = None
    return {"cni": "flannel", "version": version, "network": network, "objects": [_object_name(d) for d in docs]}


def _apply(ctx: ExecContext, c: dict[str, Any], args: list[str]) -> ExecResult:
    """``kubectl apply -f <file>`` of a pod network's manifest in the guest (a URL: only the ones
    the model knows — it fetches nothing)."""
    src = args[2] if len(args) > 2 else ""
    if src.startswith(("http://", "https://")):
        known = CNI_MANIFESTS.get(src)
        if known is None:
            return ExecResult(1, err=f"error: unable to read URL \"{src}\" (the kubectl model fetches nothing; it "
                                     f"knows {', '.join(CNI_MANIFESTS)})\n")
    else:
        raw = ctx.guest.read_file(src)
        if raw is None:
            return ExecResult(1, err=f"error: the path \"{src}\" does not exist\n")
        try:
            docs = [d for d in yaml.safe_load_all(raw) if isinstance(d, dict)]
        except yaml.YAMLError as e:
            return ExecResult(1, err=f"error: error parsing {src}: {e}\n")
        found = flannel_in(docs)
        if found is None:
            return ExecResult(1, err=f"error: {src}: the kubectl model installs Flannel's manifest only (a DaemonSet "
                                     "running docker.io/flannel/flannel)\n")
        known = found
    again = (c.get("cni") or {}).get("source") == src
    c["cni"] = {"name": known["cni"], "version": known["version"], "source": src, "network": known["network"],
                "url": src if src.startswith("https://") else None,
                "applied_at": (c.get("cni") or {}).get("applied_at") if again else time.time()}
    c["events"].append(["apply", src, time.time()])
    return ExecResult(0, out="".join(f"{o} {'unchanged' if again else 'created'}\n" for o in known["objects"]))


def _client_refused(guests: Guests, c: dict[str, Any], kubeconfig: bytes) -> str | None:
    """Why the API server refuses the client certificate of ``kubeconfig`` (None: it accepts it).
    kube-apiserver's x509 authenticator verifies the chain against the CA bundle of
    ``--client-ca-file`` and reloads that file when it changes (kubernetes
    staging/src/k8s.io/apiserver/pkg/authentication/request/x509/x509.go, dynamiccertificates'
    DynamicFileCAContent): here the file as it is now on a running control plane."""
    import base64
    import datetime as dt

    try:
        doc = yaml.safe_load(kubeconfig) or {}
        crt = x509.load_pem_x509_certificate(base64.b64decode(doc["users"][0]["user"]["client-certificate-data"]))
    except (yaml.YAMLError, KeyError, IndexError, TypeError, ValueError):
        return "no client certificate"
    path = c.get("client_ca_file", PKI + "ca.crt")
    bundle = next((g.read_file(path) for vmid in c["control_planes"]
                   if _guest_up(guests, vmid) and (g := guests.guests.get(int(vmid))) is not None
                   and g.read_file(path)), None)
    now = dt.datetime.now(dt.timezone.utc)
    if not crt.not_valid_before_utc <= now <= crt.not_valid_after_utc:
        return "certificate has expired or is not yet valid"
    for ca in x509.load_pem_x509_certificates(bundle) if bundle else []:
        try:
            crt.verify_directly_issued_by(ca)
            return None
        except Exception:  # InvalidSignature; ValueError/TypeError: another issuer or key type
            continue
    return "certificate signed by unknown authority"


@command("kubectl")
def kubectl(ctx: ExecContext) -> ExecResult:
    args = list(ctx.argv[1:])
    user_config = None
    if "--kubeconfig" in args:
        i = args.index("--kubeconfig")
        path = args[i + 1] if i + 1 < len(args) else ""
        del args[i:i + 2]
        if ctx.guest.read_file(path) is None:
            return ExecResult(1, err=f"error: stat {path}: no such file or directory\n")
        # kubeadm's own kubeconfigs hold certificates the cluster CA signed (the model does not
        # re-check them); any other file is a user's, authenticated against --client-ca-file
        user_config = ctx.guest.read_file(path) if path not in (ADMIN_CONF, SUPER_ADMIN_CONF, KUBELET_CONF) else None
    c = _my_cluster(ctx)
    if c is None:
        return ExecResult(1, err="The connection to the server localhost:8080 was refused - did you specify the right "
                                 "host or port?\n")
    guests = ctx.guest.guests
    if not _api_up(guests, c):
        return ExecResult(1, err=f"The connection to the server {c['endpoint']} was refused - did you specify the "
                                 "right host or port?\n")
    if user_config is not None and _client_refused(guests, c, user_config):
        # what kubectl prints for the API server's 401
        return ExecResult(1, err="error: You must be logged in to the server (Unauthorized)\n")
    if args[:3] == ["get", "--raw", "/readyz"]:
        return ExecResult(0, out="ok")
    if args[:2] == ["get", "nodes"]:
        items = [_node_json(guests, c, n, v) for n, v in sorted(c["nodes"].items())]
        return ExecResult(0, out=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    if args[:2] == ["apply", "-f"]:
        return _apply(ctx, c, args)
    if args[:1] == ["drain"] and len(args) > 1:
        node = args[1]
        if node not in c["nodes"]:
            return ExecResult(1, err=f"Error from server (NotFound): nodes \"{node}\" not found\n")
        c["nodes"][node]["unschedulable"] = True
        c["events"].append(["drain", node, time.time()])
        return ExecResult(0, out=f"node/{node} cordoned\nnode/{node} drained\n")
    if args[:2] == ["delete", "node"] and len(args) > 2:
        node = args[2]
        if node not in c["nodes"]:
            return ExecResult(1, err=f"Error from server (NotFound): nodes \"{node}\" not found\n")
        gone = c["nodes"].pop(node)
        if gone["vmid"] in c["control_planes"]:
            c["control_planes"].remove(gone["vmid"])
        c["events"].append(["delete", node, time.time()])
        return ExecResult(0, out=f"node \"{node}\" deleted\n")
    return ExecResult(1, err=f"error: this model of kubectl does not know {' '.join(args)!r}\n")
