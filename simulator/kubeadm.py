"""A kubeadm/kubectl model on the guest model (issue 11): command handlers for ``kubeadm`` and
``kubectl`` that run inside simulated guests (``agent/exec``, cloud-init ``runcmd``).

Everything the model knows comes from the bytes z9 shipped — the kubeadm config file and the PKI
files written by cloud-init from the NoCloud ISO (``write_files``) — never from a test flag.

Clusters are keyed by their control-plane endpoint (``host:port``) and live in the simulator's
guest manager (one dict per simulator); the state is also visible in each member's guest model
``kubeadm`` (``GET /_sim/guests/{vmid}``: ``models.kubeadm``).

``kubeadm init --config F``
    F holds an ``InitConfiguration`` (``nodeRegistration.name``) and a ``ClusterConfiguration``
    (``controlPlaneEndpoint``, ``kubernetesVersion``). Needs ``/etc/kubernetes/pki/{ca.crt,ca.key,
    sa.key,sa.pub,front-proxy-ca.crt,front-proxy-ca.key,etcd/ca.crt,etcd/ca.key}`` (kubeadm's
    "external CA" mode: the orchestrator owns the PKI) and ``ca.key`` must match ``ca.crt``. The
    cluster's API comes up ``API_DELAY_S`` seconds later (:data:`SETTINGS`); the member is a Node
    (Ready while its guest is up). Writes ``/etc/kubernetes/admin.conf``.
``kubeadm join --config F``
    F holds a ``JoinConfiguration``: ``discovery.bootstrapToken.{apiServerEndpoint, token,
    caCertHashes}``, ``nodeRegistration.name`` and, for a control plane, ``controlPlane``. Becomes a
    Node only while the cluster's API is up (some control-plane guest runs), with a token the
    cluster knows and that has not expired, and with the right CA hash (the SHA-256 of the CA's
    SubjectPublicKeyInfo) — else kubeadm's error texts and exit 1.
``kubeadm token create <token> --ttl <dur>``
    (on a control plane) the cluster knows the token until now + ttl (Go duration: ``900s``,
    ``15m0s``). A token already known: exit 1 (``already exists``).
``kubectl [--kubeconfig F] get --raw /readyz`` → ``ok`` while the API is up; F other than
``admin.conf`` is a user's kubeconfig, whose client certificate the API server authenticates
(:func:`_client_refused`) against its ``--client-ca-file`` as that file is *now*;
``kubectl get nodes -o json`` → a NodeList (``Ready`` True while the node's guest is up);
``kubectl drain <node> …`` → cordoned + drained (recorded in the cluster's ``events``);
``kubectl delete node <node>``.

Faults: a member's cloud-init fails (the guest model's ``cloud_init_fails``); a token expires (its
ttl passes — z9 chose the ttl — or :func:`expire_tokens`, admin ``POST /_sim/k8s/expire-tokens``).
"""
from __future__ import annotations

import hashlib
import re
import time
from typing import Any

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from .guest import ExecContext, ExecResult, Guests, command

SETTINGS = {"api_delay_s": 1.0}
PKI_FILES = ("ca.crt", "ca.key", "sa.key", "sa.pub", "front-proxy-ca.crt", "front-proxy-ca.key", "etcd/ca.crt",
             "etcd/ca.key")
PKI = "/etc/kubernetes/pki/"
ADMIN_CONF = "/etc/kubernetes/admin.conf"
_DUR = re.compile(r"(\d+(?:\.\d+)?)(h|m|s)")


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


def _ca_hash(pem: bytes) -> str:
    cert = x509.load_pem_x509_certificate(pem)
    spki = cert.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return "sha256:" + hashlib.sha256(spki).hexdigest()


def _load_config(ctx: ExecContext) -> tuple[dict[str, dict], ExecResult | None]:
    argv = ctx.argv
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


def _api_up(guests: Guests, c: dict[str, Any]) -> bool:
    """The API answers: past its start delay and some control-plane guest runs."""
    if time.time() < c["api_up_at"]:
        return False
    return any(_guest_up(guests, vmid) for vmid in c["control_planes"])


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


def _admin_conf(endpoint: str) -> str:
    return yaml.safe_dump({"apiVersion": "v1", "kind": "Config",
                           "clusters": [{"name": "kubernetes", "cluster": {"server": f"https://{endpoint}"}}]})


def _init(ctx: ExecContext) -> ExecResult:
    docs, err = _load_config(ctx)
    if err:
        return err
    cc, ic = docs.get("ClusterConfiguration") or {}, docs.get("InitConfiguration") or {}
    endpoint = str(cc.get("controlPlaneEndpoint") or "")
    name = str((ic.get("nodeRegistration") or {}).get("name") or ctx.guest.hostname)
    if not endpoint:
        return ExecResult(1, err="this model needs ClusterConfiguration.controlPlaneEndpoint\n")
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
    reg = clusters(ctx.guest.guests)
    if endpoint in reg and _api_up(ctx.guest.guests, reg[endpoint]):
        return ExecResult(1, err="error execution phase preflight: [preflight] Some fatal errors occurred:\n"
                                 "\t[ERROR Port-6443]: Port 6443 is in use\n")
    now = time.time()
    # kubeadm's default --client-ca-file is the cluster CA; ClusterConfiguration.apiServer.extraArgs
    # (v1beta4: a list of {name, value}) may name another (kubeadm docs, "Customizing components")
    args = {str(a.get("name")): str(a.get("value")) for a in (cc.get("apiServer") or {}).get("extraArgs") or []
            if isinstance(a, dict)}
    c = reg[endpoint] = {
        "client_ca_file": args.get("client-ca-file", PKI + "ca.crt"),
        "endpoint": endpoint, "version": str(cc.get("kubernetesVersion") or ""), "ca_crt": (ca_crt or b"").decode(),
        "ca_hash": _ca_hash(ca_crt or b""), "api_up_at": now + SETTINGS["api_delay_s"], "tokens": {},
        "control_planes": [ctx.guest.vmid],
        "nodes": {name: {"vmid": ctx.guest.vmid, "role": "control-plane", "unschedulable": False, "joined_at": now}},
        "events": [["init", name, now]],
    }
    for bt in ic.get("bootstrapTokens") or []:
        ttl = _duration_s(str(bt.get("ttl", "24h0m0s"))) or 86400.0
        c["tokens"][str(bt.get("token"))] = now + ttl
    m = ctx.guest.model("kubeadm")
    m.update(endpoint=endpoint, role="control-plane", node=name, cluster=c)
    ctx.guest.write_file(ADMIN_CONF, _admin_conf(endpoint))
    return ExecResult(0, out=f"Your Kubernetes control-plane has initialized successfully!\n")


def _join(ctx: ExecContext) -> ExecResult:
    docs, err = _load_config(ctx)
    if err:
        return err
    jc = docs.get("JoinConfiguration") or {}
    bt = (jc.get("discovery") or {}).get("bootstrapToken") or {}
    endpoint, token = str(bt.get("apiServerEndpoint") or ""), str(bt.get("token") or "")
    hashes = [str(h) for h in bt.get("caCertHashes") or []]
    name = str((jc.get("nodeRegistration") or {}).get("name") or ctx.guest.hostname)
    control_plane = jc.get("controlPlane") is not None
    guests = ctx.guest.guests
    c = clusters(guests).get(endpoint)
    if c is None or not _api_up(guests, c):
        return ExecResult(1, err=_refused(endpoint))
    tid = token.split(".", 1)[0]
    if token not in c["tokens"] or c["tokens"][token] < time.time():
        return ExecResult(1, err="error execution phase preflight: couldn't validate the identity of the API Server: "
                                 f"could not find a JWS signature in the cluster-info ConfigMap for token ID \"{tid}\"\n")
    if c["ca_hash"] not in hashes:
        return ExecResult(1, err="error execution phase preflight: couldn't validate the identity of the API Server: "
                                 "cluster CA found in cluster-info ConfigMap is invalid: none of the public keys "
                                 f"\"{c['ca_hash']}\" are pinned\n")
    if control_plane:
        missing = _missing_pki(ctx)
        if missing:
            return ExecResult(1, err=f"error execution phase control-plane-prepare/certs: {PKI}{missing}: "
                                     "no such file or directory\n")
    if name in c["nodes"] and c["nodes"][name]["vmid"] != ctx.guest.vmid and _guest_up(guests, c["nodes"][name]["vmid"]):
        return ExecResult(1, err=f"error execution phase kubelet-start: a Node with name \"{name}\" and status "
                                 "\"Ready\" already exists in the cluster\n")
    now = time.time()
    c["nodes"][name] = {"vmid": ctx.guest.vmid, "role": "control-plane" if control_plane else "worker",
                        "unschedulable": False, "joined_at": now, "token": tid}
    c["events"].append(["join", name, now])
    if control_plane:
        if ctx.guest.vmid not in c["control_planes"]:
            c["control_planes"].append(ctx.guest.vmid)
        ctx.guest.write_file(ADMIN_CONF, _admin_conf(endpoint))
    m = ctx.guest.model("kubeadm")
    m.update(endpoint=endpoint, role="control-plane" if control_plane else "worker", node=name, token=tid)
    return ExecResult(0, out="This node has joined the cluster\n")


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
    if sub[:1] == ["version"]:
        return ExecResult(0, out="kubeadm version: &version.Info{Major:\"1\"}\n")
    return ExecResult(1, err=f"unknown command \"{' '.join(sub)}\" for \"kubeadm\"\n")


def _node_json(guests: Guests, name: str, n: dict[str, Any]) -> dict[str, Any]:
    ready = _guest_up(guests, n["vmid"])
    labels = {"kubernetes.io/hostname": name}
    if n["role"] == "control-plane":
        labels["node-role.kubernetes.io/control-plane"] = ""
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels},
            "spec": {"unschedulable": True} if n["unschedulable"] else {},
            "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "Unknown",
                                       "reason": "KubeletReady" if ready else "NodeStatusUnknown"}]}}


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
        user_config = ctx.guest.read_file(path) if path != ADMIN_CONF else None
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
        items = [_node_json(guests, n, v) for n, v in sorted(c["nodes"].items())]
        import json
        return ExecResult(0, out=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
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
