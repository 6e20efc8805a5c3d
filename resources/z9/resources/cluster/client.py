"""``z9 clusters create|list|get|update|delete``, the node-pool actions ``add-node-pool``,
``resize-node-pool``, ``remove-node-pool`` (each a ClusterReconcile job) and ``z9 clusters
kubeconfig ID [--expiry …] [--merge | --file PATH]``.

A kubeconfig holds a private key: written mode 0600 (``--file``), or merged (``--merge``) into
``$KUBECONFIG`` (else ``~/.kube/config``; with several files, kubectl's rule: the one defining that
context already, else the first that exists, else the last) with a cluster, user and context all
named ``z9-<cluster name>`` — as ``doctl kubernetes cluster kubeconfig save`` does — replacing
those of an earlier merge where they are and becoming the current context (``--no-set-current``:
not); the rest of the file is kept as it was, comments and quotes included (ruamel.yaml's round
trip: :func:`merge_kubeconfig`). Without either it is printed on stdout.
"""
from __future__ import annotations

import argparse
import io
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from z9.client.cli import FAILED, OK, USAGE, Ctx
from z9.client.models import CLUSTERS, Cluster
from z9.client.commands._kind import (LABEL_ARGS, Action, Arg, KindSpec, Update, given, label, labels_of, labels_text, status_text)

STATUSES = ("creating", "running", "degraded", "updating", "deleting", "destroying", "deleted", "failed")
VERSIONS = ("1.29", "1.30", "1.31", "1.32", "1.33", "1.34")
POOL_SIZES = ("cores", "memory_mib", "disk_gib")


def _pool(text: str) -> dict[str, Any]:
    """``NAME:COUNT[:CORES[:MEMORY_MIB[:DISK_GIB]]]``."""
    parts = text.split(":")
    if not 2 <= len(parts) <= 5 or not parts[0] or not all(p.isdigit() for p in parts[1:]):
        raise argparse.ArgumentTypeError(f"a node pool is NAME:COUNT[:CORES[:MEMORY_MIB[:DISK_GIB]]] "
                                         f"(workers:2:2:4096:30), not {text!r}")
    return {"name": parts[0], "count": int(parts[1]), **{k: int(v) for k, v in zip(POOL_SIZES, parts[2:])}}


_DURATION = re.compile(r"([0-9]+)([smhd]?)")


def duration_s(text: str) -> int:
    """``3600``, ``90s``, ``30m``, ``12h``, ``7d`` → seconds."""
    m = _DURATION.fullmatch(text.strip())
    if not m:
        raise argparse.ArgumentTypeError(f"a duration is N, Ns, Nm, Nh or Nd, not {text!r}")
    return int(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]


def create_body(a: argparse.Namespace) -> dict[str, Any]:
    cp = given(count=a.control_plane_count, cores=a.control_plane_cores, memory_mib=a.control_plane_memory_mib,
               disk_gib=a.control_plane_disk_gib)
    return given(name=a.name, region=a.region, version=a.version, image=a.image, control_plane=cp,
                 node_pools=a.node_pool or [], address_pool=a.address_pool,
                 labels=dict(a.label) if a.label else None)


def _endpoint(c: Cluster) -> str | None:
    return (c.endpoint or {}).get("url")


def _pools_text(c: Cluster) -> str:
    return ", ".join(f"{p['name']} {p.get('ready', 0)}/{p['count']}" for p in c.node_pools)


def _cp_text(c: Cluster) -> str:
    cp = c.control_plane or {}
    return f"{cp.get('ready', 0)}/{cp.get('count', '?')}"


def _members_text(c: Cluster) -> str:
    return ", ".join(f"{m['name']}{'' if m.get('ready') else ' (not ready)'}" for m in c.members)


# ---------------------------------------------------------------------------------- kubeconfig

def kubeconfig_path(name: str, env: Mapping[str, str] | None = None) -> Path:
    """Where ``--merge`` writes the entries named ``name``, by kubectl's rules for ``$KUBECONFIG``
    (a list of files; ``~/.kube/config`` when unset): the file that already defines a context of
    that name, else the first file that exists, else the last of the list."""
    env = os.environ if env is None else env
    paths = [Path(p).expanduser() for p in env.get("KUBECONFIG", "").split(os.pathsep) if p]
    if not paths:
        return Path.home() / ".kube" / "config"
    for p in paths:
        try:
            doc = yaml.safe_load(p.read_text()) if p.is_file() else None
        except (OSError, UnicodeDecodeError, yaml.YAMLError):  # merged into never: refused there
            continue
        if isinstance(doc, dict) and any(isinstance(c, dict) and c.get("name") == name
                                         for c in doc.get("contexts") or []):
            return p
    return next((p for p in paths if p.exists()), paths[-1])


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` mode 0600, whole (a temporary file renamed over it). A symlink
    is written through: the file it points to is replaced, the link stays (kubectl writes
    through ``$KUBECONFIG`` links too)."""
    path = Path(os.path.realpath(path))
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a directory")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.z9-tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


#: Plain scalars kubectl's YAML reader (sigs.k8s.io/yaml → go-yaml v2, YAML 1.1: ``resolve.go``'s
#: resolve table and its strconv number parsing) takes for something other than a string: a name
#: ``y`` or ``no`` becomes a boolean, ``1.20`` or ``1e10`` a number, and kubectl refuses the file.
_GO_YAML_V2_NOT_STRINGS = frozenset({
    "y", "Y", "yes", "Yes", "YES", "n", "N", "no", "No", "NO", "true", "True", "TRUE", "false", "False", "FALSE",
    "on", "On", "ON", "off", "Off", "OFF", "~", "null", "Null", "NULL", "", "<<", ".inf", ".Inf", ".INF",
    "+.inf", "+.Inf", "+.INF", "-.inf", "-.Inf", "-.INF", ".nan", ".NaN", ".NAN"})
_NUMBER_OR_DATE = re.compile(r"[-+]?(0[xob][0-9a-fA-F_]+|[0-9_]*\.?[0-9_]*([eE][-+]?[0-9]+)?|\d{4}-\d\d?-\d\d?.*)")


def _read_as_string_by_kubectl(text: str) -> bool:
    return text not in _GO_YAML_V2_NOT_STRINGS and not (
        text[:1] in "-+.0123456789" and _NUMBER_OR_DATE.fullmatch(text) and any(c.isdigit() for c in text))


def _quoted_where_needed(value: Any) -> Any:
    """``value`` (a kubeconfig entry about to be written) with every string kubectl would not
    read back as that string double-quoted (and the rest as it is)."""
    from ruamel.yaml.comments import CommentedMap, CommentedSeq
    from ruamel.yaml.scalarstring import DoubleQuotedScalarString, ScalarString

    if isinstance(value, dict):
        out = CommentedMap()
        for k, v in value.items():
            out[k] = _quoted_where_needed(v)
        return out
    if isinstance(value, list):
        return CommentedSeq(_quoted_where_needed(v) for v in value)
    if isinstance(value, str) and not isinstance(value, ScalarString) and not _read_as_string_by_kubectl(value):
        return DoubleQuotedScalarString(value)
    return value


class NotAKubeconfig(ValueError):
    """The file to merge into is not a kubeconfig z9 can merge into (left as it is)."""


def existing_kubeconfig(path: Path) -> str | None:
    """The text of the kubeconfig at ``path`` (None: no file yet); :class:`NotAKubeconfig` when it
    is something z9 cannot merge into: a directory, unreadable, not UTF-8."""
    if not path.exists():
        return None
    if path.is_dir():
        raise NotAKubeconfig("it is a directory")
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise NotAKubeconfig(f"it is not UTF-8 text (byte {e.start})") from None
    except OSError as e:
        raise NotAKubeconfig(f"it cannot be read ({e.strerror or e})") from None


def merge_kubeconfig(existing: str | None, fetched: str, name: str, *, set_current: bool = True) -> str:
    """``existing`` (a kubeconfig's YAML, or None) with the cluster, user and context of ``fetched``
    under ``name``, as ``kubectl config set-cluster/set-credentials/set-context`` would leave it:
    the entries of other names kept, those named ``name`` replaced where they are (else added at
    the end), ``current-context`` set to ``name`` only when ``set_current``.

    Round-tripped with ruamel.yaml: the comments, quotes, key order, flow or block style and the
    indentation of the file stay as they were — a ``"y"`` stays quoted, which kubectl needs
    (go-yaml v2 reads a plain ``y`` as a boolean and refuses the whole file) — and the strings
    written anew are quoted where kubectl would read them as something else. Raises
    :class:`NotAKubeconfig` for a file whose YAML is not a mapping (or not YAML)."""
    from ruamel.yaml import YAML
    from ruamel.yaml.comments import CommentedMap, CommentedSeq
    from ruamel.yaml.error import YAMLError
    from ruamel.yaml.util import load_yaml_guess_indent

    rt = YAML(typ="rt")
    rt.preserve_quotes = True
    rt.width = 1 << 16  # never fold a long value (a certificate) onto several lines
    new = rt.load(fetched)
    cluster, user = new["clusters"][0]["cluster"], new["users"][0]["user"]
    doc, indent, seq_offset = None, 2, 0
    if existing and existing.strip():
        try:
            doc, indent, seq_offset = load_yaml_guess_indent(existing, yaml=rt)
        except YAMLError as e:
            raise NotAKubeconfig(f"not YAML ({str(e).splitlines()[0]})") from None
        if doc is not None and not isinstance(doc, dict):
            raise NotAKubeconfig(f"its YAML is a {type(doc).__name__}, not a mapping")
    # a file of only comments stays at the top of the one written
    prefix = existing.rstrip() + "\n" if doc is None and existing and existing.strip() else ""
    if doc is None:
        doc = CommentedMap([("apiVersion", "v1"), ("kind", "Config"), ("preferences", CommentedMap())])
    # the file's own indentation (ruamel.yaml's documented way of keeping it)
    rt.indent(mapping=indent or 2, sequence=indent or 2, offset=seq_offset or 0)
    for key, entry in (("clusters", {"name": name, "cluster": cluster}), ("users", {"name": name, "user": user}),
                       ("contexts", {"name": name, "context": {"cluster": name, "user": name}})):
        entries = doc.get(key)
        if not isinstance(entries, list):
            entries = doc[key] = CommentedSeq()
        value = _quoted_where_needed(entry)
        at = next((i for i, e in enumerate(entries) if isinstance(e, dict) and e.get("name") == name), None)
        if at is None:
            entries.append(value)
        else:
            entries[at] = value
    if set_current:
        doc["current-context"] = name
    out = io.StringIO()
    rt.dump(doc, out)
    return prefix + out.getvalue()


def kubeconfig(ctx: Ctx) -> int:
    a = ctx.args
    if a.merge and a.file:
        ctx.err.print("z9 clusters kubeconfig: --merge or --file, not both", highlight=False)
        return USAGE
    got = ctx.client.get_kubeconfig(a.id, expiry_s=a.expiry)
    if not a.merge and not a.file:
        if ctx.json:
            ctx.emit(got)
        else:
            ctx.out.file.write(got.kubeconfig)
        return OK
    if a.merge:
        cluster = ctx.client.get_cluster(a.id)
        name = f"z9-{cluster.name}"
        path = kubeconfig_path(name)
        try:
            merged = merge_kubeconfig(existing_kubeconfig(path), got.kubeconfig, name, set_current=a.set_current)
        except NotAKubeconfig as e:
            ctx.refuse("configuration", f"z9 clusters kubeconfig: cannot merge into {path}: {e}; the file is "
                                        "left as it is (--file PATH writes a file of its own)")
            return FAILED
    else:
        path, name, merged = Path(a.file).expanduser(), None, got.kubeconfig
    try:
        _write_private(path, merged)
    except OSError as e:
        ctx.refuse("configuration", f"z9 clusters kubeconfig: cannot write {path}: {e.strerror or e}")
        return FAILED
    info = {"path": str(path), "context": name or yaml.safe_load(got.kubeconfig).get("current-context"),
            "expires_at": got.model_dump(mode="json")["expires_at"], "user": got.user}
    if ctx.json:
        ctx.emit(info)
    else:
        ctx.err.print(f"kubeconfig written to {path} (mode 0600), context {info['context']}, "
                      f"client certificate valid until {got.expires_at:%Y-%m-%d %H:%M:%S} UTC", highlight=False)
    return OK


def _extra(verbs: Any, common: argparse.ArgumentParser, waiting: argparse.ArgumentParser) -> None:
    from z9.client.commands._group import verb

    p = verb(verbs, "kubeconfig", "a kubeconfig with a client certificate minted now: printed, written to --file, "
                                  "or merged into $KUBECONFIG / ~/.kube/config (--merge)", [common])
    p.add_argument("id", help="the cluster's id (k8s_…)")
    p.add_argument("--expiry", type=duration_s, metavar="DURATION",
                   help="the certificate's life: 3600, 30m, 12h, 7d (60 s to 1 year; default 1 h)")
    p.add_argument("--merge", action="store_true",
                   help="merge into the first file of $KUBECONFIG, else ~/.kube/config (context z9-<name>)")
    p.add_argument("--no-set-current", dest="set_current", action="store_false",
                   help="with --merge: keep the current context")
    p.add_argument("--file", metavar="PATH", help="write it to PATH (mode 0600)")
    p.set_defaults(run=kubeconfig)


KIND = KindSpec(
    kind=CLUSTERS,
    help="Kubernetes clusters: create, list, get, update, delete, add-node-pool, resize-node-pool, "
         "remove-node-pool, kubeconfig",
    statuses=STATUSES,
    id_help="the cluster's id (k8s_…)",
    columns=(("ID", lambda c: c.id), ("NAME", lambda c: c.name), ("STATUS", lambda c: c.status),
             ("VERSION", lambda c: c.version), ("ENDPOINT", _endpoint), ("CONTROL PLANE", _cp_text),
             ("NODE POOLS", _pools_text), ("REGION", lambda c: c.region)),
    fields=(("id", lambda c: c.id), ("name", lambda c: c.name), ("status", status_text),
            ("version", lambda c: c.version), ("region", lambda c: c.region), ("image", lambda c: c.image),
            ("endpoint", _endpoint), ("control plane", _cp_text), ("node pools", _pools_text),
            ("members", _members_text), ("kubeconfig", lambda c: "available" if c.kubeconfig_available else None),
            ("labels", lambda c: labels_text(c.labels)), ("created", lambda c: c.created_at)),
    create_help="create a Kubernetes cluster (a ClusterCreate job: members cloned, bootstrapped, Ready)",
    create_args=(
        Arg("--name", required=True, help="DNS label, unique in your tenant"),
        Arg("--region", required=True),
        Arg("--version", required=True, choices=VERSIONS, help="Kubernetes minor version"),
        Arg("--image", help="template of the members, carrying the --version (default: the region's first image "
                                  "that does: z9 images list)"),
        Arg("--control-plane-count", type=int, choices=(1, 3, 5), default=1, help="1, 3 or 5 (default 1)"),
        Arg("--control-plane-cores", type=int),
        Arg("--control-plane-memory-mib", type=int, metavar="MiB"),
        Arg("--control-plane-disk-gib", type=int, metavar="GiB"),
        Arg("--node-pool", action="append", type=_pool, metavar="NAME:COUNT[:CORES[:MiB[:GiB]]]",
            help="a node pool, e.g. workers:2:2:4096:30 (repeatable)"),
        Arg("--label", action="append", type=label, metavar="KEY=VALUE", help="repeatable"),
        Arg("--address-pool", metavar="POOL", help="the pool of the control-plane endpoint address")),
    create_body=create_body,
    update=Update(args=LABEL_ARGS, body=lambda a: given(labels=labels_of(a)),
                  help="replace a cluster's labels (no job)"),
    delete_help="delete a cluster at once (no buffer, no restore): its VMs, ISOs, keys and endpoint go",
    actions=(
        Action("add-node-pool", "add-node-pool", "add a node pool (a ClusterReconcile job)",
               (Arg("--name", required=True), Arg("--count", type=int, required=True), Arg("--cores", type=int),
                Arg("--memory-mib", type=int, metavar="MiB"), Arg("--disk-gib", type=int, metavar="GiB")),
               lambda a: given(name=a.name, count=a.count, cores=a.cores, memory_mib=a.memory_mib,
                               disk_gib=a.disk_gib)),
        Action("resize-node-pool", "resize-node-pool",
               "resize a node pool; a scale-down drains and removes the highest ordinals first",
               (Arg("--pool", required=True), Arg("--count", type=int, required=True)),
               lambda a: {"pool": a.pool, "count": a.count}),
        Action("remove-node-pool", "remove-node-pool", "remove a node pool (its members drained and removed)",
               (Arg("--pool", required=True),), lambda a: {"pool": a.pool}),
    ),
    extra=_extra,
)

register = KIND.register
